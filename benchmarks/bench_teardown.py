"""Worlds whose rank 0 hosts the TCPStore (tcp:// init), where every rank calls destroy_process_group() and
stays alive: how many of N fail at teardown (issue 24: about 1 in 10 failed with "Connection was likely
closed"). Usage: python benchmarks/bench_teardown.py [N] [WORLD]; prints the failures and exits 1 on any.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import socket
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist


def _rank(rank: int, world: int, port: int, eager: bool, out: Any) -> None:
    import simulator

    try:
        simulator.register(stack="nccl-legacy")
        dist.init_process_group("cpu:sim", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=20))
        if eager:
            simulator.bind_device(dist.group.WORLD)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        dist.destroy_process_group()
        out.put((rank, "ok" if t.item() == world * (world + 1) / 2 else f"all_reduce gave {t.item()}"))
        time.sleep(0.5)  # stays alive after its teardown
    except Exception:  # noqa: BLE001 - reported
        out.put((rank, traceback.format_exc(limit=3)))


def world(n: int, eager: bool) -> dict[int, str]:
    """One world of ``n`` ranks; each rank's result ("ok" or its error)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, n, port, eager, out)) for r in range(n)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    return results


def main(count: int = 50, n: int = 4) -> int:
    """Run ``count`` worlds (eager and lazy in turn); print and count the failed ones."""
    failed = 0
    started = time.perf_counter()
    for i in range(count):
        results = world(n, eager=bool(i % 2))
        bad = {r: v for r, v in results.items() if v != "ok"}
        if bad:
            failed += 1
            print(f"world {i} ({'eager' if i % 2 else 'lazy'}): {bad}")
    print(f"{failed} of {count} worlds of {n} ranks failed at teardown ({time.perf_counter() - started:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*map(int, sys.argv[1:3])))
