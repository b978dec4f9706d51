"""Per-task overhead of persistent rank pools vs. starting a fresh fork pool per task, and the
full per-check overhead of the runner (precheck, dispatch, target setup, process-state snapshot and
restore, the end-of-check rank barrier, aggregation) for a trivial check on the simulator and on gloo
in the same pools, against torch's threaded process group (the in-process ranks of
MultiThreadedTestCase: init + one all_reduce + destroy per check), timed in interleaved rounds so that
a busy machine slows all three alike.

Run: .venv/bin/python benchmarks/bench_runner_overhead.py [--runs 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conformance.runner import PoolSet, RankPool
from conformance.runner.orchestrate import run_case
from conformance.spec import load_catalog

# A minimal real check: inits a world (eager on the simulator, lazy on gloo) and runs one all_reduce.
TRIVIAL_CHECK = "QUAL-BARE-EXPANSION"
GOAL_MS = 3.0  # issue 16: per-check overhead at world 4, median

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


def threaded_pg_check(world_size: int) -> float:
    """One check the way torch's MultiThreadedTestCase runs it: a thread per rank in this process, each
    initialising the "threaded" backend on a shared HashStore, all_reducing once and destroying the group."""
    from torch.testing._internal.distributed import multi_threaded_pg as mtpg

    started = time.perf_counter()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    world = mtpg._install_threaded_pg()
    store = dist.HashStore()
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            t = torch.full((4,), float(rank + 1))
            dist.all_reduce(t)
            if t.tolist() != [world_size * (world_size + 1) / 2] * 4:
                raise RuntimeError(f"rank {rank}: threaded all_reduce gave {t.tolist()}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            mtpg.ProcessLocalGroup.exception_handle(exc)
        finally:
            if dist.distributed_c10d._world is world:
                dist.destroy_process_group()

    try:
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        mtpg._uninstall_threaded_pg()
        mtpg.ProcessLocalGroup.reset()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if errors:
        raise RuntimeError(f"threaded process group check failed: {errors[0]!r}")
    return time.perf_counter() - started


def bench_checks_side_by_side(world_size: int, runs: int, rounds: int = 10, warmup: int = 10
                              ) -> dict[str, list[float]]:
    """Per-check wall time of the trivial check on sim and on gloo (run_case, shared warm pools) and of the
    threaded process group, in ``rounds`` interleaved rounds of ``runs // rounds`` each."""
    req = next(r for r in load_catalog() if r.id == TRIVIAL_CHECK)
    pools = PoolSet()

    def one(name: str) -> float:
        if name == "threaded":
            return threaded_pg_check(world_size)
        started = time.perf_counter()
        result = run_case(pools, req, name, world_size)
        if result.outcome != "pass":
            raise RuntimeError(f"{TRIVIAL_CHECK} did not run and pass on {name}: {result.outcome} {result.detail}")
        return time.perf_counter() - started

    names = ("sim", "gloo", "threaded")
    samples: dict[str, list[float]] = {n: [] for n in names}
    try:
        for name in names:
            for _ in range(warmup):
                one(name)
        per_round = max(1, runs // rounds)
        for _ in range(rounds):
            for name in names:
                samples[name] += [one(name) for _ in range(per_round)]
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
    side = {k: _ms(v) for k, v in bench_checks_side_by_side(4, max(20, args.runs // 2)).items()}
    check, gloo, threaded = side["sim"], side["gloo"], side["threaded"]
    print(f"full per-check path ws=4 ({TRIVIAL_CHECK}: init + 1 all_reduce), interleaved rounds:")
    print(f"  simulator pool        median {check[0]:7.2f} ms   p90 {check[1]:7.2f} ms")
    print(f"  gloo, same pools      median {gloo[0]:7.2f} ms   p90 {gloo[1]:7.2f} ms")
    print(f"  torch threaded PG     median {threaded[0]:7.2f} ms   p90 {threaded[1]:7.2f} ms   (baseline)")
    print(f"  ratio simulator/threaded {check[0] / threaded[0]:.2f}x   gloo/threaded {gloo[0] / threaded[0]:.2f}x   "
          f"goal: simulator median <= {GOAL_MS:g} ms: {'met' if check[0] <= GOAL_MS else 'NOT met'}")
    fresh_check = _ms(bench_check(4, args.fresh_runs, warmup=2, fresh=True))
    print(f"same check with a fresh fork pool per check ws=4: median {fresh_check[0]:7.2f} ms   "
          f"p90 {fresh_check[1]:7.2f} ms   ratio {fresh_check[0] / check[0]:.1f}x")


if __name__ == "__main__":
    main()
