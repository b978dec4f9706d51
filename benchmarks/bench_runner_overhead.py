"""Per-task overhead of persistent rank pools vs. starting a fresh fork pool per task, and the
full per-check overhead of the runner (precheck, dispatch, target setup, process-state snapshot and
restore, the end-of-check rank barrier, aggregation) for a trivial check on the simulator.

Run: /tmp/venv/bin/python benchmarks/bench_runner_overhead.py [--runs 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conformance.runner import PoolSet, RankPool
from conformance.runner.orchestrate import run_case
from conformance.spec import load_catalog

# A minimal real check: inits a simulator world (eager) and runs one all_reduce.
TRIVIAL_CHECK = "QUAL-BARE-EXPANSION"

TASK = f"{__name__}:noop"  # resolvable in fork workers, which share this __main__


def noop(rank: int, world_size: int, store: Any) -> int:
    return rank


def _ms(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(0.9 * (len(ordered) - 1))] * 1e3


def _timed_run(pool: RankPool) -> float:
    started = time.perf_counter()
    reports = pool.run(TASK, {}, timeout_s=30)
    elapsed = time.perf_counter() - started
    if any(r.status != "ok" for r in reports):
        raise RuntimeError(f"trivial task failed: {reports}")
    return elapsed


def bench_pool(world_size: int, runs: int, warmup: int = 20) -> list[float]:
    pool = RankPool(world_size)
    try:
        for _ in range(warmup):
            _timed_run(pool)
        return [_timed_run(pool) for _ in range(runs)]
    finally:
        pool.close()


def bench_fresh_pool(world_size: int, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        pool = RankPool(world_size)
        try:
            _timed_run(pool)
        finally:
            pool.close()
        samples.append(time.perf_counter() - started)
    return samples


def bench_check(world_size: int, runs: int, warmup: int = 10, fresh: bool = False) -> list[float]:
    """Wall time of run_case for the trivial check on the simulator, after warm-up.

    ``fresh`` starts a new pool for every check (what a fork-per-test harness pays), as the baseline.
    """
    req = next(r for r in load_catalog() if r.id == TRIVIAL_CHECK)
    pools = PoolSet()
    try:
        samples = []
        for i in range(warmup + runs):
            started = time.perf_counter()
            if fresh:
                pools.close()
                pools = PoolSet()
            result = run_case(pools, req, "sim", world_size)
            if result.outcome != "pass":
                raise RuntimeError(f"{TRIVIAL_CHECK} did not run and pass: {result.outcome} {result.detail}")
            if i >= warmup:
                samples.append(time.perf_counter() - started)
        return samples
    finally:
        pools.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timed runs per world size")
    parser.add_argument("--fresh-runs", type=int, default=20, help="timed fresh-pool runs (baseline)")
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} runs={args.runs} (after warm-up)")
    pooled = {}
    for world_size in (2, 4, 8):
        pooled[world_size] = _ms(bench_pool(world_size, args.runs))
        print(f"persistent pool  ws={world_size}: median {pooled[world_size][0]:7.2f} ms   "
              f"p90 {pooled[world_size][1]:7.2f} ms")
    fresh = _ms(bench_fresh_pool(4, args.fresh_runs))
    print(f"fresh fork pool per task ws=4 ({args.fresh_runs} runs): "
          f"median {fresh[0]:7.2f} ms   p90 {fresh[1]:7.2f} ms")
    print(f"ratio fresh/persistent at ws=4 (median): {fresh[0] / pooled[4][0]:.1f}x")
    check = _ms(bench_check(4, max(20, args.runs // 4)))
    print(f"full per-check path ws=4 ({TRIVIAL_CHECK} on sim: init + 1 all_reduce): "
          f"median {check[0]:7.2f} ms   p90 {check[1]:7.2f} ms")
    fresh_check = _ms(bench_check(4, args.fresh_runs, warmup=2, fresh=True))
    print(f"same check with a fresh fork pool per check ws=4: median {fresh_check[0]:7.2f} ms   "
          f"p90 {fresh_check[1]:7.2f} ms   ratio {fresh_check[0] / check[0]:.1f}x")


if __name__ == "__main__":
    main()
