"""Data-plane bandwidth of the simulator against gloo and against this machine's copy bandwidth, one run.

For all_reduce (sum) and all_gather of float32 at 1, 4, 16 and 64 MiB per rank, 4 ranks (forked, one
intra-op thread each), rank 0's median op time. Bandwidth counts the minimal memory traffic of the op:
every output byte of every rank written once and read once from somewhere, i.e. 2 x (total output
bytes over ranks): 2*n*N for all_reduce, 2*n*n*N for all_gather (N = bytes per rank's input).
The copy baseline copies the same bytes: a plain torch copy of the op's total output bytes (T = n*N
or n*n*N) between two buffers in this process with every core's threads, 2*T / time (read + write),
measured before the sim run and after the gloo run; the faster of the two is the baseline (the
stricter one). Goals (issue 16): sim >= 70% of copy, sim >= 2x gloo.

Run: .venv/bin/python benchmarks/bench_data_plane.py [--sizes 1,4,16,64] [--world 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_sim_vs_gloo as harness

MIB = 1 << 20
OPS = ("all_reduce", "all_gather")


def copy_seconds(nbytes: int, iters: int) -> float:
    """Median seconds of a torch copy of ``nbytes`` between two fresh buffers (all cores)."""
    torch.set_num_threads(os.cpu_count() or 1)
    src, dst = torch.rand(nbytes // 4), torch.empty(nbytes // 4)
    samples = []
    for i in range(iters + 2):
        started = time.perf_counter()
        dst.copy_(src)
        if i >= 2:
            samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def traffic(op: str, nbytes: int, world: int) -> int:
    """Minimal bytes moved by one op over all ranks: every output byte written once and read once."""
    return 2 * (world * nbytes if op == "all_reduce" else world * world * nbytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16,64", help="MiB per rank, comma-separated")
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    mibs = [int(x) for x in args.sizes.split(",")]
    harness.WORLD = args.world
    harness.SIZES = [(m * MIB, f"{m} MiB", 2, max(3, 64 // m)) for m in mibs]
    harness.OPS = OPS
    started = time.perf_counter()
    world = args.world
    outputs = {(op, m): traffic(op, m * MIB, world) // 2 for op in OPS for m in mibs}
    copy_before = {k: copy_seconds(v, max(5, 256 * MIB // v)) for k, v in outputs.items()}
    sim = harness.measure("sim")
    gloo = harness.measure("gloo")
    copy_after = {k: copy_seconds(v, max(5, 256 * MIB // v)) for k, v in outputs.items()}
    print(f"{world} ranks, float32, {os.cpu_count()} CPU cores, torch {torch.__version__}; GB/s = minimal "
          "traffic (2 x output bytes over ranks) / median op time; copy = 2T / copy time of the op's T output bytes")
    print(f"{'op':<11} {'size':>7} {'sim GB/s':>9} {'gloo GB/s':>10} {'copy GB/s':>10} {'sim/copy':>9} "
          f"{'goal':>5} {'sim/gloo':>9} {'goal':>5} {'sim ms':>8} {'gloo ms':>8}")
    for m in mibs:
        label, nbytes = f"{m} MiB", m * MIB
        for op in OPS:
            copy_bw = 2 * outputs[op, m] / min(copy_before[op, m], copy_after[op, m]) / 1e9
            s, g = sim[op, label], gloo[op, label]
            sim_bw, gloo_bw = traffic(op, nbytes, world) / s / 1e9, traffic(op, nbytes, world) / g / 1e9
            r_copy, r_gloo = sim_bw / copy_bw, g / s
            print(f"{op:<11} {label:>7} {sim_bw:>9.2f} {gloo_bw:>10.2f} {copy_bw:>10.2f} {r_copy:>9.2f} "
                  f"{'ok' if r_copy >= 0.7 else 'MISS':>5} {r_gloo:>9.2f} {'ok' if r_gloo >= 2 else 'MISS':>5} "
                  f"{s * 1e3:>8.2f} {g * 1e3:>8.2f}")
    print(f"total {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
