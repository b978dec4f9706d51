"""The rank process: connect to the pool's store once, then run tasks the parent sends over a pipe
(the messages of ``messages.py``)."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import fcntl
import importlib
import mmap
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from multiprocess.reduction import ForkingPickler

from conformance.runner.messages import RankStatus, Ready, RunTask, StorePort, TaskDone
from simulator import futex

LOOPBACK = "127.0.0.1"
# A name prefix unique to the rank pool, set in every rank: a target names what its ranks leave outside
# themselves (shared memory, files) with it, and its ``cleanup(prefix)`` removes that after a kill.
SCRATCH_ENV = "CONFORMANCE_SCRATCH"
WATCH_THREAD_NAME = "cfm-parent-watch"
_PARENT_POLL_S = 0.2
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}

_tasks: dict[str, Callable[..., Any]] = {}
_BARRIER_SLICE_S = 0.1  # longest single sleep of a barrier wait: it rechecks its condition this often


class PoolBarrier:
    """The ranks of one pool meeting at the end of a task, in a shared-memory segment the pool made (a memfd
    of the parent's, opened through ``/proc/<pid>/fd``), with no store round trip and no wake-up of the parent.

    Word ``1 + r`` holds 1 + the last run id rank ``r`` has arrived at (0: none yet; written by ``r`` alone);
    word 0's low half is a futex bell. A rank arrives under an exclusive ``flock`` of the segment (each rank's
    own open of it), so the last to arrive sees every other arrival; it alone sets the bell to a token never
    set before (its rank and a count) and wakes the waiters, so that a waiter that read the bell before checking
    the words either sees the change or is woken by it, once: ringing at every arrival woke every waiting rank
    n times per task, n^2 wake-ups that took the CPU from the ranks still working (split+p2p at world 16 and 32
    ran 10-25% slower than with the store's wait).
    """

    def __init__(self, world_size: int, ref: str | None = None) -> None:
        self.world_size = world_size
        size = 8 * (1 + world_size)
        if ref is None:  # the pool's side: owns the segment
            self.fd = os.memfd_create("cfm-pool-barrier", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, size)
            self.ref = f"{os.getpid()}:{self.fd}"
            self._map = mmap.mmap(self.fd, size)
        else:
            pid, fd = ref.split(":")
            own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
            try:
                self._map = mmap.mmap(own, size)
            except BaseException:
                os.close(own)
                raise
            self.fd, self.ref = own, ref  # kept: the rank's own open of the segment, which it flocks
        self._words = (ctypes.c_int64 * (1 + world_size)).from_buffer(self._map)
        self._bell = ctypes.c_int32.from_buffer(self._map)
        self._tokens = 0

    def arrive(self, rank: int, run_id: int) -> None:
        """Say that ``rank`` has arrived at run ``run_id``; the last rank to arrive wakes the waiters."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            self._words[1 + rank] = run_id + 1
            last = self._all_arrived(run_id)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        if last:
            self._tokens += 1
            self._bell.value = ((rank & 0xFF) << 23) | (self._tokens & 0x7FFFFF)
            futex.wake(ctypes.addressof(self._bell))

    def _all_arrived(self, run_id: int) -> bool:
        return all(self._words[1 + r] > run_id for r in range(self.world_size))

    def wait(self, run_id: int, timeout_s: float) -> bool:
        """Wait until every rank has arrived at run ``run_id``, at most ``timeout_s``; False if the time ran out."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self._bell.value
            if self._all_arrived(run_id):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            futex.wait(ctypes.addressof(self._bell), seen, min(remaining, _BARRIER_SLICE_S))

    def close(self) -> None:
        """Release the mapping (and, on the pool's side, the segment's fd)."""
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with the process
            del self._words, self._bell
            self._map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# The run this rank process is in: (pool rank, pool world size, run id, the pool's barrier), set by the worker
# loop around each task; None outside a pool task.
_current: tuple[int, int, int, PoolBarrier] | None = None


def peer_barrier(rank: int, world_size: int) -> Callable[[float], bool] | None:
    """For a task running as this pool rank of this pool's world size: a function that says this rank has
    finished and waits (at most its argument, in seconds) for every rank of the pool to say so, returning
    whether they did. None where the caller is another world's rank (a torchrun job's, run in a one-rank pool)
    or outside a pool: it then meets its peers through its store."""
    current = _current
    if current is None or current[:2] != (rank, world_size):
        return None
    _, _, run_id, barrier = current

    def arrive_and_wait(timeout_s: float) -> bool:
        barrier.arrive(rank, run_id)
        return timeout_s <= 0 or barrier.wait(run_id, timeout_s)

    return arrive_and_wait


def _load(task: str) -> Callable[..., Any]:
    """Resolve ``"package.module:function"``, importing the module once per process."""
    fn = _tasks.get(task)
    if fn is None:
        module, _, name = task.partition(":")
        if not name:
            raise ValueError(f"task {task!r} is not of the form 'package.module:function'")
        fn = _tasks[task] = getattr(importlib.import_module(module), name)
    return fn


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the parent dies (we are re-parented), even mid-task."""
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


def _run_one(rank: int, world_size: int, client: dist.Store, msg: RunTask, barrier: PoolBarrier | None = None
             ) -> TaskDone:
    global _current
    store = dist.PrefixStore(f"run{msg.run_id}/", client)
    started = time.perf_counter()
    _current = (rank, world_size, msg.run_id, barrier) if barrier is not None else None
    try:
        value = _load(msg.task)(rank=rank, world_size=world_size, store=store, **msg.kwargs)
        status, error, tb = RankStatus.OK, "", ""
    except BaseException as exc:  # a task's SystemExit is reported, not obeyed  # noqa: BLE001
        value, status = None, RankStatus.RAISED
        error, tb = f"{type(exc).__name__}: {exc}", traceback.format_exc()
    finally:
        _current = None
        sys.stdout.flush()
        sys.stderr.flush()
    return TaskDone(msg.run_id, status, value, error, tb, time.perf_counter() - started)


def dumps(message: object) -> bytes:
    """A pipe message's bytes: from the C pickler when it can (dill, the pipes' own pickler, is pure Python:
    20-30 us for a check's task or outcome against about 1 us), else from dill (a lambda in it, say), which
    the other end's ``recv`` reads either way."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - whatever the C pickler refuses, dill may still take
        return bytes(ForkingPickler.dumps(message))


def _send_result(conn: Any, result: TaskDone) -> None:
    try:
        conn.send_bytes(dumps(result))
    except Exception as exc:  # e.g. an unpicklable return value; the pipe is untouched  # noqa: BLE001
        error = f"task result could not be sent: {type(exc).__name__}: {exc}"
        conn.send(TaskDone(result.run_id, RankStatus.RAISED, None, error, traceback.format_exc(), result.duration_s))


def main(
    rank: int, conn: Any, *, world_size: int, parent_pid: int, env: dict[str, str], stack_path: str
) -> None:
    """Entry point of one rank process (the ``multiprocess.Process`` target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked copy of the parent's handler must not run here
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # the pool blocks them while it forks
    os.environ.update(env)
    # N ranks share few cores: torch's default intra-op threads would spin against each other.
    torch.set_num_threads(int(os.environ.get("CONFORMANCE_RANK_THREADS", "1")))
    try:
        # the pool created it; opened without O_CREAT, so a rank never adds a file to a directory being removed
        stack_file = os.fdopen(os.open(stack_path, os.O_WRONLY | os.O_APPEND), "w")
    except FileNotFoundError:  # the pool is shutting down (a signal arrived while it forked): nothing to run
        os._exit(0)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=stack_file, all_threads=True)  # a segfault's stack goes where the pool reads it
    threading.Thread(target=_watch_parent, args=(parent_pid,), name=WATCH_THREAD_NAME, daemon=True).start()
    try:
        start: StorePort = conn.recv()
        client = dist.TCPStore(LOOPBACK, start.port, is_master=False, wait_for_workers=False)
        barrier = PoolBarrier(world_size, start.barrier) if start.barrier else None
        conn.send(Ready())
        while True:
            msg = conn.recv()
            _send_result(conn, _run_one(rank, world_size, client, msg, barrier))
    except (EOFError, OSError):
        pass  # the parent closed the pipe: we are done
