"""The framework front door: run a framework's own group builder on the simulator, under the rules of the
stack the simulator models (``--stack``), and judge every group it made (ARCHITECTURE.md, "The framework
front door", lists the judgements).

``python -m conformance framework --builder MODULE:FUNCTION --world-size 8 [--kwargs JSON]``

It sees the groups the builder makes through ``torch.distributed.new_group`` and ``split_group`` (the simulator's
lazy backend, ``sim-lazy``, is registered beside the world's as torch 2.15 registers ``nccl-lazy``), and only what
the simulator shows of them; groups made before the builder runs are not recorded.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import simulator
from conformance.outcomes import Outcome
from conformance.report import Result, write_report
from conformance.report.details import distinct_details
from conformance.runner.isolation import ProcessState
from conformance.runner.messages import RankStatus
from conformance.runner.orchestrate import aggregate, case_result, rank_outcome
from conformance.runner.pool import RankPool, RankReport
from conformance.spec import load_catalog
from conformance.targets.base import Driver, Target, WorldSpec
from conformance.targets.sim import SimTarget
from conformance.torch_compat import new_group_splits, split_child_ranks
from conformance.verdict import ExitCode
from simulator.stacks import STACKS

CHECKS = ("SPLIT-MEMBERSHIP", "SPLIT-BOUND-INHERIT", "QUAL-SUBGROUP-FILTER", "HINT-TORCHCOMMS-OPTIONS")
TASK = "conformance.framework:observe_groups"


def load_builder(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function (ValueError naming what is wrong)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"--builder must be MODULE:FUNCTION, got {spec!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--builder {spec!r}: {exc}") from exc


# ------------------------------------------------------------------------------ one rank
class Recorder:
    """Wraps torch.distributed.new_group and split_group while the builder runs and keeps every call (a
    split_group call as the one group it gives this rank: the split holding it, or none), and whether the stack
    splits its communicator from the world's (``new_group_splits``: a new_group's may be a fresh one)."""

    def __init__(self, new_group_splits: bool = True) -> None:
        self.calls: list[dict[str, Any]] = []
        self._originals = {"new_group": dist.new_group, "split_group": dist.split_group}
        self._new_group_splits = new_group_splits

    def _keep(self, asked: list[int], backend: Any, options: Any, group: Any, split: bool = True) -> Any:
        self.calls.append({"ranks": asked, "backend": None if backend is None else str(backend),
                           "options": options, "group": group, "split": split})
        return group

    def __enter__(self) -> Recorder:
        new, split = self._originals["new_group"], self._originals["split_group"]

        def new_group(ranks: Any = None, timeout: Any = None, backend: Any = None, pg_options: Any = None,
                      *args: Any, **kwargs: Any) -> Any:
            group = new(ranks, timeout, backend, pg_options, *args, **kwargs)
            asked = sorted(ranks) if ranks is not None else list(range(dist.get_world_size()))
            return self._keep(asked, backend, pg_options, group, self._new_group_splits)

        def split_group(parent_pg: Any = None, split_ranks: Any = None, timeout: Any = None, pg_options: Any = None,
                        group_desc: Any = None, backend: Any = None, **kwargs: Any) -> Any:
            group = split(parent_pg, split_ranks, timeout, pg_options, group_desc, backend, **kwargs)
            rank = dist.get_rank()
            mine = next((split_child_ranks(list(s)) for s in split_ranks or [] if rank in s), [])
            return self._keep(mine, backend, pg_options, group)

        for name, wrapper in (("new_group", new_group), ("split_group", split_group)):
            setattr(dist, name, wrapper)
            setattr(dist.distributed_c10d, name, wrapper)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)
            setattr(dist.distributed_c10d, name, original)


def _qualified(backend: str | None, devices: set[str]) -> str | None:
    """None if the filter is absent or device-qualified over `devices`, else why not."""
    if backend is None:
        return None
    tokens = [token.strip() for token in backend.split(",")]
    bad = [token for token in tokens if ":" not in token or token.split(":")[0].strip() not in devices]
    if not bad:
        return None
    problem = (f"backend filter {backend!r}: {bad} not of the form <device>:<backend> over the parent's devices "
               f"{sorted(devices)}")
    if len(devices) == 1 and all(":" not in token for token in bad):  # bare names on a one-device parent
        fixed = ",".join(token if ":" in token else f"{next(iter(devices))}:{token}" for token in tokens)
        problem += (f"; a bare name leaves torch to guess the device, the finding Megatron-LM PR 5385 fixes with "
                    f"device-qualified filters: pass backend={fixed!r}")
    return problem


def observe(call: dict[str, Any], rank: int, world: Any) -> dict[str, Any]:
    """What this rank sees of one recorded group (plain values only)."""
    from simulator import SimOptions
    from simulator.config import options_to_hints

    group, asked = call["group"], call["ranks"]
    member = rank in asked
    seen: dict[str, Any] = {"ranks": asked, "backend": call["backend"], "member": member,
                            "filter_problem": _qualified(call["backend"], {"cpu"}),
                            "options_given": call["options"] is not None, "split": call["split"]}
    is_group = isinstance(group, dist.ProcessGroup)
    seen["got_group"] = is_group
    if not (member and is_group):
        return seen
    seen["torch_ranks"] = dist.get_process_group_ranks(group)
    t = torch.full((2,), float(rank), dtype=torch.float64)
    dist.all_reduce(t, group=group)
    seen["sum_ok"] = torch.equal(t, torch.full((2,), float(sum(asked)), dtype=torch.float64))
    seen["bound"] = str(group.bound_device_id)
    seen["parent_bound"] = str(world.bound_device_id)
    comm = getattr(group, "communicator", None)
    parent = getattr(world, "communicator", None)
    if comm is not None:
        seen.update(comm_members=list(comm.members), comm_mode=comm.mode, comm_parent=comm.parent,
                    comm_device=comm.device, parent_comm=getattr(parent, "id", None),
                    parent_device=getattr(parent, "device", None), hints=dict(comm.config.get("hints", {})))
    options = call["options"]
    if isinstance(options, SimOptions):
        seen["expected_hints"] = options_to_hints(options)
    elif options is not None:
        seen["expected_hints"] = f"options of type {type(options).__name__}, which the simulator cannot translate"
    return seen


class FrameworkTarget(Target):
    """The description a framework run reports as: the simulator modelling ``stack``, named after the builder."""

    def __init__(self, builder: str, kwargs: dict[str, Any], stack: str) -> None:
        self.name = f"framework-{builder}"
        self.builder, self.kwargs = builder, kwargs
        self.simulator = SimTarget(stack=stack)

    @property
    def stack(self) -> str:
        return self.simulator.stack

    def unavailable_reason(self, world_size: int = 1) -> str | None:
        return self.simulator.unavailable_reason(world_size)

    def driver(self) -> Driver:
        return self.simulator.driver()

    @property
    def capabilities(self) -> frozenset[str]:
        return self.simulator.capabilities

    def environment(self) -> dict[str, Any]:
        return {"builder": self.builder, "kwargs": self.kwargs, "stack": self.stack}

    def cleanup(self, scratch: str) -> None:
        self.simulator.cleanup(scratch)


def observe_groups(rank: int, world_size: int, store: dist.Store, builder: str, kwargs: dict[str, Any],
                   timeout_s: float, stack: str) -> list[dict[str, Any]]:
    """The pool task of one rank: a bound simulator world modelling ``stack`` (the sim target's driver), the
    builder run in it, what this rank observes of every group it made."""
    state = ProcessState.capture()
    driver = SimTarget(stack=stack).driver()
    try:
        driver.setup(rank, world_size)
        simulator.register(simulator.LAZY_BACKEND_NAME, stack="nccl-lazy")  # as torch 2.15 registers nccl-lazy
        world = driver.init_world(store, rank, world_size, WorldSpec(mode="eager"), timeout_s)
        with Recorder(new_group_splits(stack)) as recorder:
            load_builder(builder)(**kwargs)
        return [observe(call, rank, world) for call in recorder.calls]
    finally:
        try:
            driver.teardown()
        finally:
            state.restore()


def run_ranks(target: FrameworkTarget, world_size: int, timeout_s: float) -> list[RankReport]:
    """Run ``observe_groups`` on a rank pool of its own (the runner's: crashes, hangs and peers of a failed
    rank are reported as in a check)."""
    pool = RankPool(world_size)
    pool.on_kill(target.name, target.cleanup)
    try:
        return pool.run(TASK, {"builder": target.builder, "kwargs": target.kwargs, "timeout_s": timeout_s,
                               "stack": target.stack}, timeout_s * 4)
    finally:
        pool.close()


# ---------------------------------------------------------------------------- judgements
def _members(obs: dict[str, Any], rank: int) -> list[str]:
    if not obs["member"]:
        return [f"rank {rank}: not in {obs['ranks']} but got a group"] if obs["got_group"] else []
    if not obs["got_group"]:
        return [f"rank {rank}: member of {obs['ranks']} but got no group"]
    problems = []
    if obs["torch_ranks"] != obs["ranks"]:
        problems.append(f"rank {rank}: group {obs['ranks']}: expected members {obs['ranks']}, "
                        f"observed {obs['torch_ranks']} (get_process_group_ranks)")
    if "comm_members" in obs and obs["comm_members"] != obs["ranks"]:
        problems.append(f"rank {rank}: group {obs['ranks']}: expected communicator members {obs['ranks']}, "
                        f"observed {obs['comm_members']}")
    if not obs["sum_ok"]:
        problems.append(f"rank {rank}: group {obs['ranks']}: all_reduce of ranks did not give {sum(obs['ranks'])}")
    return problems


def _binding(obs: dict[str, Any], rank: int) -> list[str]:
    if not (obs["member"] and obs["got_group"]):
        return []
    where = f"rank {rank}: group {obs['ranks']}"
    problems = []
    if obs["bound"] != obs["parent_bound"]:
        problems.append(f"{where}: expected bound device {obs['parent_bound']}, observed {obs['bound']}")
    if not _simulator_group(obs["backend"]):
        # another backend's group (gloo; the lazy pipeline backend, made by its members alone): not split from
        # the world's communicator by design, so judged by the binding it shows
        return problems
    if "comm_mode" not in obs:
        return [*problems, f"{where}: no simulator communicator to inspect"]
    if obs["split"] and (obs["comm_mode"] != "split" or obs["comm_parent"] != obs["parent_comm"]):
        problems.append(f"{where}: expected a communicator split from {obs['parent_comm']}, observed mode "
                        f"{obs['comm_mode']!r} with parent {obs['comm_parent']}")
    if not obs["split"] and (obs["comm_mode"] != "eager" or obs["comm_parent"] is not None):
        # torch 2.15's torchcomms routing makes a new_group's communicator with new_comm (simulator.stacks)
        problems.append(f"{where}: expected a fresh communicator among the members (new_comm, not split), "
                        f"observed mode {obs['comm_mode']!r} with parent {obs['comm_parent']}")
    if obs["comm_device"] != obs["parent_device"]:
        problems.append(f"{where}: expected communicator device {obs['parent_device']}, observed {obs['comm_device']}")
    return problems


def _simulator_group(backend: str | None) -> bool:
    """Whether a group made with this backend filter is the simulator's (no filter: the world's backend)."""
    return backend is None or any(token.split(":")[-1].strip() == "sim" for token in backend.split(","))


def _filter(obs: dict[str, Any], rank: int) -> list[str]:
    return [f"rank {rank}: group {obs['ranks']}: {obs['filter_problem']}"] if obs["filter_problem"] else []


def _options(obs: dict[str, Any], rank: int) -> list[str]:
    if not (obs["options_given"] and obs["member"] and obs["got_group"] and _simulator_group(obs["backend"])):
        return []
    expected = obs.get("expected_hints")
    if not isinstance(expected, dict):
        return [f"rank {rank}: group {obs['ranks']}: {expected}"]
    hints = obs.get("hints", {})  # parsed: "8" arrives as 8, "true" as True
    missing = {k: v for k, v in expected.items() if str(hints.get(k)).lower() != v.lower()}
    if missing:
        return [f"rank {rank}: group {obs['ranks']}: expected hints {expected}, observed {hints} "
                f"(missing or different: {missing})"]
    return []


JUDGES: dict[str, Callable[[dict[str, Any], int], list[str]]] = {
    "SPLIT-MEMBERSHIP": _members, "SPLIT-BOUND-INHERIT": _binding, "QUAL-SUBGROUP-FILTER": _filter,
    "HINT-TORCHCOMMS-OPTIONS": _options,
}


def _nothing_to_judge(rid: str, groups: list[dict[str, Any]], stack: str) -> str | None:
    if rid == "HINT-TORCHCOMMS-OPTIONS" and stack != "torchcomms":
        return f"options become torchcomms hints on the torchcomms stack only, not on {stack} (--stack torchcomms)"
    if not groups:
        return "the builder created no groups"
    if rid == "QUAL-SUBGROUP-FILTER" and all(g["backend"] is None for g in groups):
        return "the builder passed no backend filter (its groups inherit the parent's backends)"
    if rid == "HINT-TORCHCOMMS-OPTIONS" and not any(g["options_given"] for g in groups):
        return "the builder passed no pg_options"
    return None


def judge(reports: list[RankReport], target: FrameworkTarget, duration_s: float) -> list[Result]:
    """One Result per judged requirement, over every rank's observations; a rank that did not return its
    observations (the builder raised, a rank crashed or hung) makes each an error naming how."""
    catalog = {r.id: r for r in load_catalog()}
    n = len(reports)
    # the ranks that failed, those the pool abandoned after them last
    failed = [rank_outcome(rep) for rep in sorted(reports, key=lambda rep: rep.status is RankStatus.ABORTED)
              if rep.status is not RankStatus.OK]
    observed = {rep.rank: rep.value for rep in reports}
    out = []
    for rid in CHECKS:
        req = catalog[rid]
        if failed:
            out.append(case_result(req, target.name, n, Outcome.ERROR,
                                   f"the builder failed: {aggregate(failed)[1]}", duration_s, failed))
            continue
        groups = observed[0]
        skip = _nothing_to_judge(rid, groups, target.stack)
        if skip:
            out.append(case_result(req, target.name, n, Outcome.SKIP, skip, duration_s))
            continue
        problems = distinct_details((r, p) for r in range(n) for obs in observed[r] for p in JUDGES[rid](obs, r))
        others = sum(rid == "HINT-TORCHCOMMS-OPTIONS" and not _simulator_group(g["backend"]) for g in groups)
        detail = "; ".join(problems[:20]) if problems else f"{len(groups) - others} groups judged on {n} ranks"
        if others:  # the simulator turns options into hints on its torchcomms stack's own groups only
            detail += f" ({others} of another backend not judged: the simulator has no torchcomms routing for them)"
        out.append(case_result(req, target.name, n, Outcome.FAIL if problems else Outcome.PASS, detail, duration_s))
    return out


# ------------------------------------------------------------------------------ front door
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `framework` subcommand's arguments."""
    p.add_argument("--builder", required=True, help="MODULE:FUNCTION that creates the framework's groups")
    p.add_argument("--world-size", type=int, default=8, help="ranks to run it on (default 8)")
    p.add_argument("--kwargs", type=json.loads, default={}, help="keyword arguments for the builder, as JSON")
    p.add_argument("--report-dir", type=Path, default=Path("reports"), help="where framework-<name>.json/.md go")
    p.add_argument("--timeout", type=float, default=60.0, help="per-rank store and collective timeout (s)")
    p.add_argument("--stack", choices=list(STACKS), default="",
                   help="the NCCL stack the simulator models (default: what this torch's 'nccl' means)")


def run(builder: str, world_size: int, kwargs: dict[str, Any], timeout_s: float = 60.0,
        stack: str = "") -> list[Result]:
    """Run the builder on ``world_size`` simulator ranks modelling ``stack`` (default: what this torch's
    ``nccl`` means) and judge its groups."""
    state = ProcessState.capture()
    try:
        load_builder(builder)  # fail fast, in the parent, on a bad spec
    finally:
        state.restore()  # what importing it registered with torch (Megatron-Core: "fake" for hpu) stays out
    if not isinstance(kwargs, dict):
        raise ValueError(f"--kwargs must be a JSON object, got {kwargs!r}")
    target = FrameworkTarget(builder, kwargs, stack)
    start = time.monotonic()
    reports = run_ranks(target, world_size, timeout_s)
    return judge(reports, target, time.monotonic() - start)


def cmd_framework(args: argparse.Namespace) -> int:
    """Entry point of ``python -m conformance framework``: the report goes through ``session.finish_run``."""
    from conformance.session import SuiteRun, finish_run, statements

    suite = SuiteRun(generation=None)  # started now; the builder's groups are judged as made: no generated cases
    try:
        suite.results = run(args.builder, args.world_size, args.kwargs, args.timeout, args.stack)
    except ValueError as exc:
        print(f"error: {exc}")
        return ExitCode.BAD_INPUT
    report = finish_run(suite, FrameworkTarget(args.builder, args.kwargs, args.stack)).report
    json_path, md_path = write_report(report, args.report_dir, statements())
    for r in suite.results:
        print(f"{r.requirement:<26} {r.outcome:<6} {r.detail[:200]}")
    print(f"verdict: {report['verdict']}  report: {json_path} {md_path}")
    return ExitCode.for_verdict(report["verdict"])
