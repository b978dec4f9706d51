"""Throughput of the simulator's shared-memory Fabric vs. real torch gloo, 4 ranks on this machine.

all_reduce (sum) and all_gather of float32 at 4 KiB, 1 MiB and 64 MiB per rank; GB/s of per-rank
payload (bytes of one rank's input / op time), median over timed iterations after warm-up, as seen
by rank 0. Both backends run in forked processes with one intra-op thread per rank.

Run: /tmp/venv/bin/python benchmarks/bench_sim_vs_gloo.py
"""

from __future__ import annotations

import datetime
import os
import queue
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import multiprocess
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from simulator import shm
from simulator.fabric import Fabric

WORLD = 4
SIZES = [(4 << 10, "4 KiB", 3, 300), (1 << 20, "1 MiB", 3, 40), (64 << 20, "64 MiB", 1, 5)]
OPS = ("all_reduce", "all_gather")
PREFIX = f"benchsim{os.getpid()}_"
CTX = multiprocess.get_context("fork")


def _time_ops(run_op: Callable[[str, torch.Tensor, list[torch.Tensor]], None]) -> dict[tuple[str, str], float]:
    """Median seconds per op for every (op, size label), timed back to back on this rank."""
    medians = {}
    for nbytes, label, warmup, iters in SIZES:
        x = torch.rand(nbytes // 4)
        outs = [torch.empty_like(x) for _ in range(WORLD)]
        for op in OPS:
            samples = []
            for i in range(warmup + iters):
                started = time.perf_counter()
                run_op(op, x, outs)
                if i >= warmup:
                    samples.append(time.perf_counter() - started)
            medians[op, label] = statistics.median(samples)
    return medians


def _rank(backend: str, rank: int, ports: Any, results: Any) -> None:
    torch.set_num_threads(1)  # 4 ranks on 2 cores: more intra-op threads only spin against each other
    store = dist.TCPStore("127.0.0.1", ports.get(timeout=60), is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    if backend == "gloo":
        dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)

        def run_op(op: str, x: torch.Tensor, outs: list[torch.Tensor]) -> None:
            dist.all_reduce(x) if op == "all_reduce" else dist.all_gather(outs, x)

        medians = _time_ops(run_op)
        dist.destroy_process_group()
    else:
        fab = Fabric(dist.PrefixStore("bench", store), "bench", list(range(WORLD)), rank, 120.0, PREFIX)

        def run_op(op: str, x: torch.Tensor, outs: list[torch.Tensor]) -> None:
            fab.all_reduce([x], "sum") if op == "all_reduce" else fab.all_gather(outs, x)

        medians = _time_ops(run_op)
        fab.close()
    results.put((rank, medians))


def measure(backend: str) -> dict[tuple[str, str], float]:
    """Run the timing loop on WORLD forked ranks; return rank 0's medians."""
    ports, results = CTX.Queue(), CTX.Queue()
    procs = [CTX.Process(target=_rank, args=(backend, r, ports, results), daemon=True) for r in range(WORLD)]
    for p in procs:  # fork before the store server thread exists
        p.start()
    master = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    for _ in procs:
        ports.put(master.port)
    got: dict[int, Any] = {}
    try:
        while len(got) < WORLD:
            try:
                rank, medians = results.get(timeout=1)
            except queue.Empty:
                if not all(p.is_alive() for p in procs):
                    raise RuntimeError(f"{backend}: a rank died: {[p.exitcode for p in procs]}") from None
                continue
            got[rank] = medians
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        shm.sweep(PREFIX)
    return got[0]


def main() -> None:
    started = time.perf_counter()
    sim, gloo = measure("sim"), measure("gloo")
    print(f"{WORLD} ranks, float32, GB/s of per-rank payload (median), {os.cpu_count()} CPU cores")
    print(f"{'op':<11} {'size':>7} {'sim GB/s':>9} {'gloo GB/s':>10} {'sim/gloo':>9} {'sim ms':>9} {'gloo ms':>9}")
    for nbytes, label, _, _ in SIZES:
        for op in OPS:
            s, g = sim[op, label], gloo[op, label]
            print(f"{op:<11} {label:>7} {nbytes / s / 1e9:>9.3f} {nbytes / g / 1e9:>10.3f} {g / s:>9.2f} "
                  f"{s * 1e3:>9.3f} {g * 1e3:>9.3f}")
    print(f"total {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
