"""Host time of 64 coalesced all_reduce ops against 64 separate ones, on the simulator and gloo.

Measures, on every rank, the CPU time (process time) and the wall time spent issuing and
completing the ops, median over repetitions after warm-up, and prints the ratio separate/coalesced
(the seed PR for _coalescing_manager measured about 4x less CPU time). Run:
    python benchmarks/bench_coalescing_overhead.py [--world-size 4] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import multiprocess as mp
import torch
import torch.distributed as dist

import simulator

N_OPS = 64


def _issue(tensors: list[torch.Tensor], coalesced: bool) -> None:
    if coalesced:
        with dist._coalescing_manager():
            for t in tensors:
                dist.all_reduce(t)
    else:
        for t in tensors:
            dist.all_reduce(t)


def _rank(rank: int, world_size: int, port: int, backend: str, reps: int, queue: object) -> None:
    simulator.register()
    store = dist.TCPStore("127.0.0.1", port, world_size, False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    if backend == "cpu:sim":
        simulator.bind_device(dist.group.WORLD)
    tensors = [torch.ones(256) for _ in range(N_OPS)]
    timings: dict[str, list[tuple[float, float]]] = {"separate": [], "coalesced": []}
    for i in range(reps + 3):
        for mode in ("separate", "coalesced"):
            dist.barrier()
            cpu, wall = time.process_time(), time.perf_counter()
            _issue(tensors, mode == "coalesced")
            if i >= 3:
                timings[mode].append((time.process_time() - cpu, time.perf_counter() - wall))
    queue.put((rank, timings))
    dist.destroy_process_group()


def measure(backend: str, world_size: int, reps: int) -> dict[str, tuple[float, float]]:
    """Median (cpu ms, wall ms) per mode, over ranks and repetitions."""
    master = dist.TCPStore("127.0.0.1", 0, world_size, True, wait_for_workers=False)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world_size, master.port, backend, reps, queue))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(30)
    out = {}
    for mode in ("separate", "coalesced"):
        samples = [s for _, t in results for s in t[mode]]
        out[mode] = (statistics.median(c for c, _ in samples) * 1e3, statistics.median(w for _, w in samples) * 1e3)
    return out


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    print(f"{N_OPS} all_reduce of 256 float32, {args.world_size} ranks, median of {args.reps} reps per rank")
    print(f"{'backend':<10}{'mode':<11}{'cpu ms':>9}{'wall ms':>9}")
    for backend in ("cpu:sim", "gloo"):
        res = measure(backend, args.world_size, args.reps)
        for mode, (cpu, wall) in res.items():
            print(f"{backend:<10}{mode:<11}{cpu:>9.2f}{wall:>9.2f}")
        sep, coal = res["separate"], res["coalesced"]
        print(f"{backend:<10}{'ratio':<11}{sep[0] / coal[0]:>8.1f}x{sep[1] / coal[1]:>8.1f}x   (separate / coalesced)")


if __name__ == "__main__":
    main()
