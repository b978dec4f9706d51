"""Small task functions the runner tests send to rank pools."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from conformance.runner.worker import SCRATCH_ENV


def echo(rank: int, world_size: int, store: Any, value: Any = None) -> dict:
    return {"rank": rank, "world_size": world_size, "value": value, "pid": os.getpid(),
            "scratch": os.environ.get(SCRATCH_ENV), "extra": os.environ.get("CFM_TEST_ENV")}


def exchange(rank: int, world_size: int, store: Any) -> dict:
    """Every rank publishes a value, counts itself in, and reads everyone's values."""
    store.set(f"value/{rank}", str(rank * 10))
    store.add("count", 1)
    seen = [int(store.get(f"value/{r}")) for r in range(world_size)]
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in range(world_size)])
    return {"seen": seen, "count": store.add("count", 0)}


def raise_on(rank: int, world_size: int, store: Any, bad_rank: int) -> int:
    if rank == bad_rank:
        raise ValueError(f"rank {rank} refuses")
    return rank


def hang_in_sleep(rank: int, world_size: int, store: Any, bad_rank: int) -> int:
    if rank == bad_rank:
        time.sleep(600)
    return rank


def hang_in_store_get(rank: int, world_size: int, store: Any) -> int:
    store.get("never-set")
    return rank


def exit_with(rank: int, world_size: int, store: Any, bad_rank: int, code: int) -> int:
    if rank == bad_rank:
        os._exit(code)
    return rank


def exit_then_wait_for_peer(rank: int, world_size: int, store: Any, bad_rank: int) -> int:
    """The bad rank dies; its peers block waiting for a key it never writes."""
    if rank == bad_rank:
        os._exit(3)
    store.get("from-bad-rank")
    return rank


def sigkill_self(rank: int, world_size: int, store: Any, bad_rank: int) -> int:
    if rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def make_shm_file(rank: int, world_size: int, store: Any) -> str:
    path = f"/dev/shm/{os.environ[SCRATCH_ENV]}rank{rank}"
    with open(path, "wb") as f:
        f.write(b"x")
    return path


def remove_shm_files(scratch: str) -> None:
    """A target's cleanup hook for make_shm_file's files (what the pool calls after a kill)."""
    for name in os.listdir("/dev/shm"):
        if name.startswith(scratch):
            os.unlink(f"/dev/shm/{name}")


def unpicklable(rank: int, world_size: int, store: Any) -> Any:
    return (i for i in range(1))  # generators do not pickle, even with dill


def segfault_on(rank: int, world_size: int, store: Any, bad_rank: int) -> int:
    """The bad rank dies of SIGSEGV inside this function."""
    if rank == bad_rank:
        import ctypes

        ctypes.string_at(0)
    store.get("from-bad-rank")
    return rank


def exit_at_recorded_time(rank: int, world_size: int, store: Any, bad_rank: int, path: str) -> int:
    """The bad rank writes the time it exits to ``path`` and exits; its peers block on a key never set."""
    if rank == bad_rank:
        with open(path, "w") as f:
            f.write(repr(time.time()))
        os._exit(3)
    store.get("from-bad-rank")
    return rank


def _open_fds_when_idle(settle_s: float = 5.0) -> list[str]:
    """What this process's fds point to, once no simulator stream worker is serving (bounded wait): a worker
    still finishing a destroyed world's last op holds that world's store connection for a moment, which is
    no leak; a busy host can delay it."""
    from simulator.stream import PARKED_THREAD_NAME, THREAD_PREFIX

    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and any(
            t.name.startswith(THREAD_PREFIX) and t.name != PARKED_THREAD_NAME for t in threading.enumerate()):
        time.sleep(0.01)
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the fd listdir itself used, closed since
            continue
    return sorted(targets)


def fds_over_reinits(rank: int, world_size: int, store: Any, rounds: int, fresh_store: bool) -> dict:
    """Init a simulator world ``rounds`` times (with a new_group each time), on a fresh TCPStore each time or
    on the pool's store; what the open fds point to after each round (round -> targets)."""
    import datetime

    import torch
    import torch.distributed as dist

    import simulator

    simulator.register()
    counts = {}
    for i in range(rounds):
        if not fresh_store:
            fresh = dist.PrefixStore(f"world{i}/", store)
        elif rank == 0:
            fresh = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=30))
            store.set(f"port/{i}", str(fresh.port))
        else:
            port = int(store.get(f"port/{i}"))
            fresh = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("cpu:sim", store=fresh, rank=rank, world_size=world_size)
        t = torch.ones(4)
        dist.all_reduce(t)
        group = dist.new_group(list(range(world_size)))
        dist.all_reduce(t, group=group)
        dist.barrier()
        for step in ("ops", "destroyed"):  # the store host goes last, once no rank uses its store
            store.set(f"{step}/{i}/{rank}", "1")
            store.wait([f"{step}/{i}/{r}" for r in range(world_size)])
            if step == "ops":
                dist.destroy_process_group()
        del fresh, group
        counts[i + 1] = _open_fds_when_idle()
    return counts


def split_and_p2p_without_pickle(rank: int, world_size: int, store: Any, requirement_id: str) -> dict:
    """Run a simulator check with pickle.loads wrapped to record calls made from the simulator's code."""
    import pickle
    import sys

    from conformance.runner.execute import run_check

    calls: list[str] = []
    real = pickle.loads

    def refuse(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        if f"{os.sep}simulator{os.sep}" in caller:  # torch's own config snapshots may unpickle locally
            calls.append(caller)
        return real(*args, **kwargs)

    pickle.loads = refuse
    try:
        value = run_check(rank, world_size, store, requirement_id, "sim", None, 20.0)
    finally:
        pickle.loads = real
    return {"outcome": value["outcome"], "detail": value["detail"], "unpickles": len(calls)}


def meet(rank: int, world_size: int, store: Any, late_rank: int = -1, late_s: float = 0.0, wait_s: float = 5.0,
         as_world: int = 0) -> dict:
    """Meet at the pool's end-of-task barrier (``late_rank`` arriving ``late_s`` late); what each rank saw.
    ``as_world``: ask for the barrier as a rank of a world of that size (a torchrun job's, say)."""
    from conformance.runner import worker

    barrier = worker.peer_barrier(rank, as_world or world_size)
    if barrier is None:
        return {"barrier": False}
    if rank == late_rank:
        time.sleep(late_s)
    started = time.monotonic()
    met = barrier(wait_s)
    return {"barrier": True, "met": met, "waited_s": time.monotonic() - started}
