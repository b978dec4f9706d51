"""The simulator's control plane, in one run: per-check overhead against torch's threaded process group, store
round trips per check and per op, cases per second of the generated sweep, and split+p2p at scale.

1. Per-check overhead at world 2, 4 and 8: run_case of a trivial check (init + one all_reduce + destroy,
   bench_runner_overhead.TRIVIAL_CHECK) in warm pools against torch's threaded process group (the in-process
   ranks of MultiThreadedTestCase), interleaved in rounds so that a busy machine slows both alike.
2. Store round trips: every c10d Store method called from Python in the rank processes (the simulator, torch's
   Python front end, the runner: dist.Store's methods wrapped with a counter before the pools fork; the
   simulator reaches the store only from Python) over the same check, and over a task that runs a simulator
   world doing K collectives and K send/recv pairs, for K = 1 and K = 1 + OPS: the difference divided by
   OPS is the store traffic per op, per rank, on each stack.
3. Cases per second of ``python -m conformance run --target sim --world-sizes 2,4`` (generated cases at the
   default budget; the case count read from its JSON report).
4. Wall time of ``run --target sim --area split,p2p --world-sizes n`` for n = 8, 16, 32, 64.

With ``--base-tree DIR`` (a checkout of the tree to compare with, e.g. ``git archive main | tar -x -C DIR``), 1, 3
and 4 also run in DIR (``-m conformance`` imports the suite of its working directory): 1 before this tree's, 3 and 4
beside the same command here, which tree goes first alternating (``--rounds`` runs of 3 each), so that a load that
rises or falls during the run does not favour one. The load average is printed before and after each part: on a shared
host every figure is one under that load, and only figures of one run compare.

Run: .venv/bin/python benchmarks/bench_control_plane.py [--runs 500] [--worlds 8,16,32,64] [--base-tree DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_runner_overhead import TRIVIAL_CHECK, threaded_pg_check  # noqa: E402
from bench_scale import area_seconds  # noqa: E402

from conformance.runner import PoolSet  # noqa: E402
from conformance.runner.orchestrate import run_case  # noqa: E402
from conformance.spec import load_catalog  # noqa: E402

STORE_METHODS = ("set", "get", "add", "wait", "check", "multi_get", "multi_set", "compare_set", "delete_key",
                 "append", "num_keys")
OPS = 100
_calls = [0]


def count_store_calls() -> None:
    """Wrap every method of dist.Store (its subclasses define none of their own) with a counter of this process."""
    for name in STORE_METHODS:
        original = getattr(dist.Store, name)

        def counted(self: dist.Store, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            _calls[0] += 1
            return _original(self, *args, **kwargs)

        setattr(dist.Store, name, counted)


def store_calls() -> int:
    """Store calls this process made since count_store_calls() (less those take_count took)."""
    return _calls[0]


def take_count(rank: int, world_size: int, store: Any) -> int:
    """Pool task: this rank's store calls since the last take (the take itself makes none)."""
    count, _calls[0] = _calls[0], 0
    return count


def ops_task(rank: int, world_size: int, store: Any, stack: str, ops: int) -> int:
    """Pool task: a simulator world (bound, as the suite's sim target makes it) doing ``ops`` all_reduces and
    ``ops`` send/recv pairs around a ring; returns the store calls of this rank during the world's life."""
    import simulator

    before = _calls[0]
    simulator.register(stack=stack)
    try:
        dist.init_process_group("cpu:sim", store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60), device_id=None)
        simulator.bind_device(dist.group.WORLD)
        t = torch.empty(4)
        for _ in range(ops):
            dist.all_reduce(t.fill_(rank + 1))
        buf = torch.empty(4)
        for _ in range(ops):
            ops_ = [dist.P2POp(dist.isend, t, (rank + 1) % world_size),
                    dist.P2POp(dist.irecv, buf, (rank - 1) % world_size)]
            for w in dist.batch_isend_irecv(ops_):
                w.wait()
        expected = world_size * (world_size + 1) // 2
        if t[0].item() != expected or buf[0].item() != expected:
            raise RuntimeError(f"rank {rank}: gave {t[0].item()} and received {buf[0].item()}, expected {expected}")
        dist.destroy_process_group()
    finally:
        simulator.unregister()
    return _calls[0] - before


def _ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def checks_side_by_side(pools: PoolSet, world_size: int, runs: int, rounds: int = 10, warmup: int = 10
                        ) -> tuple[list[float], list[float], float]:
    """(simulator samples, threaded samples, store calls per rank per check) for the trivial check."""
    req = next(r for r in load_catalog() if r.id == TRIVIAL_CHECK)

    def sim() -> float:
        started = time.perf_counter()
        result = run_case(pools, req, "sim", world_size)
        if result.outcome != "pass":
            raise RuntimeError(f"{TRIVIAL_CHECK} did not pass: {result.outcome} {result.detail}")
        return time.perf_counter() - started

    for _ in range(warmup):
        sim()
        threaded_pg_check(world_size)
    pool = pools.get(world_size)
    pool.run(f"{__name__}:take_count", {}, timeout_s=30)
    sims: list[float] = []
    threaded: list[float] = []
    per_round = max(1, runs // rounds)
    for _ in range(rounds):
        sims += [sim() for _ in range(per_round)]
        threaded += [threaded_pg_check(world_size) for _ in range(per_round)]
    counts = [r.value for r in pool.run(f"{__name__}:take_count", {}, timeout_s=30)]
    return sims, threaded, sum(counts) / world_size / len(sims)


def per_op_store_calls(pools: PoolSet, world_size: int, stack: str) -> tuple[float, float]:
    """(store calls per rank of a world doing 1 op of each kind, extra calls per op over OPS more ops)."""
    pool = pools.get(world_size)
    counts = {}
    for ops in (1, 1 + OPS):
        reports = pool.run(f"{__name__}:ops_task", {"stack": stack, "ops": ops}, timeout_s=120)
        bad = [r for r in reports if r.status != "ok"]
        if bad:
            raise RuntimeError(f"ops task on {stack} failed: {bad[0]}")
        counts[ops] = sum(r.value for r in reports) / world_size
    return counts[1], (counts[1 + OPS] - counts[1]) / (2 * OPS)


def cases_per_second(tree: Path = ROOT) -> tuple[int, float]:
    """(cases, wall seconds) of ``run --target sim --world-sizes 2,4`` at the default budget, in ``tree``."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "conformance", "run", "--target", "sim", "--world-sizes", "2,4",
                               "--report-dir", tmp], cwd=tree, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - started
        if done.returncode not in (0, 1):
            raise RuntimeError(f"conformance run exited {done.returncode}: {done.stderr[-2000:]}")
        report = json.loads((Path(tmp) / "sim.json").read_text())
    return len(report["results"]), elapsed


_BASE_CHECKS = """
import sys
sys.path.insert(0, "benchmarks")
import bench_control_plane as b
b.count_store_calls()
pools = b.PoolSet()
try:
    for world_size in (2, 4, 8):
        runs = {runs} if world_size == 4 else max(20, {runs} // 2)
        sims, threaded, calls = b.checks_side_by_side(pools, world_size, runs)
        print(f"  world {{world_size}}: simulator {{b._ms(sims):6.2f}} ms ({{len(sims)}} checks)   threaded PG "
              f"{{b._ms(threaded):6.2f}} ms   ratio {{b._ms(sims) / b._ms(threaded):5.2f}}x   "
              f"store calls {{calls:5.1f}}", flush=True)
finally:
    pools.close()
"""


def base_checks(tree: Path, runs: int) -> None:
    """Part 1 in ``tree`` (its own benchmark functions, pools and suite), printed as it goes."""
    subprocess.run([sys.executable, "-c", _BASE_CHECKS.format(runs=runs)], cwd=tree, check=False)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="checks at world 4 (worlds 2 and 8: half as many)")
    parser.add_argument("--worlds", default="8,16,32,64", help="world sizes of the split,p2p areas")
    parser.add_argument("--base-tree", type=Path, help="also run parts 1, 3 and 4 in this tree, beside this one's")
    parser.add_argument("--rounds", type=int, default=1, help="runs of part 3 per tree (alternating which goes first)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPU cores, torch {torch.__version__}, {_load()} at start: every figure below is under "
          f"the load of whatever else runs on this host; compare only figures of one run", flush=True)
    if args.base_tree:
        print(f"per-check overhead in the base tree {args.base_tree} (as below)", flush=True)
        base_checks(args.base_tree, args.runs)
    count_store_calls()
    pools = PoolSet()
    try:
        print("per-check overhead (init + 1 all_reduce + destroy), median; store calls per rank per check")
        for world_size in (2, 4, 8):
            runs = args.runs if world_size == 4 else max(20, args.runs // 2)
            sims, threaded, calls = checks_side_by_side(pools, world_size, runs)
            print(f"  world {world_size}: simulator {_ms(sims):6.2f} ms ({len(sims)} checks)   threaded PG "
                  f"{_ms(threaded):6.2f} ms   ratio {_ms(sims) / _ms(threaded):5.2f}x   "
                  f"store calls {calls:5.1f}   ({_load()})", flush=True)
        print(f"store calls per rank at world 4: a world doing 1 all_reduce and 1 send/recv pair, and per op over "
              f"{OPS} more of each")
        for stack in ("nccl-legacy", "nccl2", "nccl-lazy", "torchcomms"):
            base, per_op = per_op_store_calls(pools, 4, stack)
            print(f"  {stack:12s} world of 1 op each: {base:6.1f}   per op: {per_op:6.2f}", flush=True)
    finally:
        pools.close()
    trees = ([("base", args.base_tree)] if args.base_tree else []) + [("this tree", ROOT)]

    def ordered(round_: int) -> list[tuple[str, Path]]:  # alternate which tree goes first: a load trend hits both
        return trees if round_ % 2 == 0 else trees[::-1]

    runs: dict[str, list[float]] = {name: [] for name, _ in trees}
    for round_ in range(args.rounds):
        for name, tree in ordered(round_):
            cases, secs = cases_per_second(tree)
            runs[name].append(secs)
            print(f"run --target sim --world-sizes 2,4 ({name}): {cases} cases in {secs:.1f} s = "
                  f"{cases / secs:.1f} cases/s   ({_load()})", flush=True)
    if args.rounds > 1:
        print("  mean: " + ", ".join(f"{name} {statistics.mean(v):.1f} s" for name, v in runs.items()), flush=True)
    for i, n in enumerate(int(x) for x in args.worlds.split(",")):
        for name, tree in ordered(args.rounds + i):
            secs, rc = area_seconds(n, cwd=str(tree))
            print(f"run --target sim --area split,p2p --world-sizes {n} ({name}): {secs:.1f} s (exit {rc})   "
                  f"({_load()})", flush=True)
    print(f"{_load()} at end")


if __name__ == "__main__":
    main()
