"""Where one check's time goes: the trivial check (init + one all_reduce + destroy) on the simulator's warm
pools, broken down per rank and on the parent, with the store calls of each phase.

Each phase's function is wrapped with a timer (CLOCK_MONOTONIC, which every process of the host shares) before
the pools fork, so the ranks inherit the wrappers; a pool task collects each rank's records. Phases nest (the
breakdown says which contain which); "dispatch" is from the parent sending the task to the rank starting it,
"return" from the rank ending the task to the parent holding its report.

Run: .venv/bin/python benchmarks/profile_check.py [--runs 300] [--world-size 4]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_control_plane import count_store_calls, store_calls  # noqa: E402
from bench_runner_overhead import TRIVIAL_CHECK, threaded_pg_check  # noqa: E402

import simulator  # noqa: E402
import simulator.backend  # noqa: E402
import simulator.comm  # noqa: E402
import simulator.control  # noqa: E402
import simulator.fabric  # noqa: E402
from conformance.runner import PoolSet, execute, orchestrate, pool, worker  # noqa: E402
from conformance.spec import load_catalog  # noqa: E402
from conformance.targets import sim  # noqa: E402

_records: list[tuple[str, float, float, int, float]] = []  # (phase, start, end, store calls, thread CPU s)


def _timed(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls, start, cpu = store_calls(), time.monotonic(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _records.append((name, start, time.monotonic(), store_calls() - calls, time.thread_time() - cpu))
    return wrapper


def _wrap(owner: Any, attr: str, name: str) -> None:
    setattr(owner, attr, _timed(name, getattr(owner, attr)))


def install() -> None:
    """Wrap the phases (in this process: the pools fork after it)."""
    count_store_calls()
    _wrap(worker, "_run_one", "rank: task (worker._run_one)")
    _wrap(execute, "run_check", "rank:  run_check")
    _wrap(execute.ProcessState, "capture", "rank:   state capture")
    _wrap(execute, "make_target", "rank:   make_target + driver")
    _wrap(execute, "load_checks", "rank:   load_checks")
    _wrap(sim.SimDriver, "setup", "rank:   driver.setup (register)")
    _wrap(sim.SimDriver, "init_world", "rank:    driver.init_world")
    _wrap(dist, "init_process_group", "rank:     init_process_group")
    _wrap(simulator.comm, "world_namespace", "rank:      world_namespace (uid)")
    _wrap(simulator.backend, "world_namespace", "rank:      world_namespace (uid)")
    _wrap(simulator, "bind_device", "rank:     bind_device (bootstrap)")
    _wrap(simulator.backend, "rendezvous", "rank:      boot rendezvous")
    _wrap(simulator.control.ControlPlane, "__init__", "rank:      control plane + mailbox")
    _wrap(simulator.comm.Communicator, "__post_init__", "rank:      communicator (fabric)")
    _wrap(dist, "all_reduce", "rank:    all_reduce")
    _wrap(simulator.control.ControlPlane, "peers", "rank:     mailbox refs (peers)")
    _wrap(simulator.fabric.Fabric, "all_reduce", "rank:     (stream thread) Fabric.all_reduce")
    _wrap(simulator.fabric.Fabric, "close", "rank:     (teardown) Fabric.close")
    _wrap(execute, "_quiesce", "rank:   end-of-check barrier (_quiesce)")
    _wrap(sim.SimDriver, "teardown", "rank:   driver.teardown")
    _wrap(dist, "destroy_process_group", "rank:    destroy_process_group")
    _wrap(simulator.backend.SimProcessGroup, "shutdown", "rank:     sim shutdown")
    _wrap(simulator.backend.SimProcessGroup, "_leave_together", "rank:      leave together")
    _wrap(execute.ProcessState, "restore", "rank:   state restore")
    _wrap(orchestrate, "precheck", "parent:  precheck")
    _wrap(orchestrate, "make_target", "parent:  make_target")
    _wrap(pool.RankPool, "run", "parent:  pool.run")


_prof: list[Any] = []


def _profiled(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _prof:
            import cProfile
            _prof.append(cProfile.Profile(time.thread_time))
        _prof[0].enable()
        try:
            return fn(*args, **kwargs)
        finally:
            _prof[0].disable()
    return wrapper


def dump_profile(rank: int, world_size: int, store: Any, path: str) -> None:
    """Pool task: write this rank's cProfile stats to ``path``.<rank>."""
    if _prof:
        _prof[0].dump_stats(f"{path}.{rank}")
        _prof.clear()


def take(rank: int, world_size: int, store: Any) -> list[tuple[str, float, float, int]]:
    """Pool task: this rank's records since the last take."""
    out = list(_records)
    _records.clear()
    out.append(("cpu", 0.0, time.process_time(), 0, 0.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--cprofile", default="", help="also cProfile the ranks' tasks into this path.<rank>")
    args = parser.parse_args()
    if args.cprofile:  # the ranks' main threads; and, apart, the stream thread's collective
        execute.run_check = _profiled(execute.run_check)
        simulator.fabric.Fabric.all_reduce = _profiled(simulator.fabric.Fabric.all_reduce)
    n = args.world_size
    print(f"{os.cpu_count()} CPU cores, torch {torch.__version__}, load average {os.getloadavg()[0]:.2f} at start")
    install()
    req = next(r for r in load_catalog() if r.id == TRIVIAL_CHECK)
    pools = PoolSet()
    per_phase: dict[str, list[float]] = collections.defaultdict(list)
    calls: dict[str, list[int]] = collections.defaultdict(list)
    cpus: dict[str, list[float]] = collections.defaultdict(list)
    totals: list[float] = []
    try:
        for _ in range(20):
            orchestrate.run_case(pools, req, "sim", n)
        p = pools.get(n)
        cpu0 = [r.value[-1][2] for r in p.run(f"{__name__}:take", {}, timeout_s=30)]
        _records.clear()
        parent_cpu0 = time.process_time()
        for _ in range(args.runs):
            sent = time.monotonic()
            result = orchestrate.run_case(pools, req, "sim", n)
            done = time.monotonic()
            if result.outcome != "pass":
                raise RuntimeError(f"{result.outcome}: {result.detail}")
            totals.append(done - sent)
            per_phase["parent: run_case"].append(done - sent)
            for name, s, e, _c, cpu in _records:
                per_phase[name].append(e - s)
                cpus[name].append(cpu)
            # the rank records of this check, read at the end (a take per check would add a round trip)
            _records.clear()
        parent_cpu = time.process_time() - parent_cpu0
        rank_records = [r.value for r in p.run(f"{__name__}:take", {}, timeout_s=60)]
        rank_cpu = [recs.pop()[2] - c0 for recs, c0 in zip(rank_records, cpu0)]
        for recs in rank_records:
            for name, s, e, c, cpu in recs:
                per_phase[name].append(e - s)
                calls[name].append(c)
                cpus[name].append(cpu)
        if args.cprofile:
            p.run(f"{__name__}:dump_profile", {"path": args.cprofile}, timeout_s=60)
        threaded = [threaded_pg_check(n) for _ in range(max(50, args.runs // 2))]
    finally:
        pools.close()
    checks = len(totals)
    print(f"world {n}, {checks} checks; median wall ms per occurrence (median CPU ms of the calling thread), "
          f"occurrences per check (all ranks), store calls per occurrence (mean); phases nest as indented")
    for name in sorted(per_phase, key=lambda k: (not k.startswith("parent"), list(per_phase).index(k))):
        v = per_phase[name]
        c = calls.get(name)
        cpu = f"(CPU {statistics.median(cpus[name]) * 1e3:6.3f})" if cpus.get(name) else " " * 12
        print(f"  {name:48s} {statistics.median(v) * 1e3:7.3f} ms {cpu}  x{len(v) / checks:4.1f}"
              + (f"  store {statistics.mean(c):5.1f}" if c else ""))
    print(f"  CPU per check: parent {parent_cpu / checks * 1e3:.3f} ms (incl. its store server thread), ranks "
          + ", ".join(f"{c / checks * 1e3:.3f}" for c in rank_cpu) + " ms")
    print(f"  threaded PG check (same run)                     {statistics.median(threaded) * 1e3:7.3f} ms")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
