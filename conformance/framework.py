"""The framework front door: run a framework's own group builder on the simulator, under the
rules of the stack the simulator models (``--stack``: a device-bound parent, subgroups split from it,
on torchcomms options turned into hints), then judge every group it made.

``python -m conformance framework --builder MODULE:FUNCTION --world-size 8 [--kwargs JSON]``

Every rank calls ``FUNCTION(**kwargs)`` after init (the simulator's lazy backend, ``sim-lazy``, registered beside
the world's as torch 2.15 registers ``nccl-lazy``); each ``torch.distributed.new_group`` and ``split_group`` call
it makes is recorded (ranks, backend filter, pg_options, the group returned). Judged per group:

- SPLIT-MEMBERSHIP: members get a group of exactly the ranks asked for (torch's view and the
  communicator's), an all_reduce over it gives the exact sum of those ranks, non-members get none;
- SPLIT-BOUND-INHERIT: the group carries the parent's bound device and its communicator was split
  from the parent's (not bootstrapped afresh) with the parent's device (a group of another backend, gloo or
  the lazy one, by the binding alone);
- QUAL-SUBGROUP-FILTER: a backend filter, where one is given, is device-qualified ("cpu:sim", not
  "sim") and names only devices the parent serves;
- HINT-TORCHCOMMS-OPTIONS: options given arrive in the communicator as torchcomms hints (torchcomms stack; the
  world's backend's groups).

A judgement with nothing to judge (no filter, no options given) is a skip that says so.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conformance.outcomes import Outcome
from conformance.report import RankOutcome, Result, write_report
from conformance.report.build import build_report, now_iso
from conformance.report.details import distinct_details, merge_details
from conformance.report.environment import collect_environment
from conformance.runner.forked import fork_and_collect
from conformance.spec import load_catalog
from conformance.torch_compat import default_stack, split_child_ranks
from conformance.verdict import ExitCode
from simulator.stacks import STACKS

CHECKS = ("SPLIT-MEMBERSHIP", "SPLIT-BOUND-INHERIT", "QUAL-SUBGROUP-FILTER", "HINT-TORCHCOMMS-OPTIONS")


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
    split_group call as the one group it gives this rank: the split holding it, or none)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._originals = {"new_group": dist.new_group, "split_group": dist.split_group}

    def _keep(self, asked: list[int], backend: Any, options: Any, group: Any) -> Any:
        self.calls.append({"ranks": asked, "backend": None if backend is None else str(backend),
                           "options": options, "group": group})
        return group

    def __enter__(self) -> Recorder:
        new, split = self._originals["new_group"], self._originals["split_group"]

        def new_group(ranks: Any = None, timeout: Any = None, backend: Any = None, pg_options: Any = None,
                      *args: Any, **kwargs: Any) -> Any:
            group = new(ranks, timeout, backend, pg_options, *args, **kwargs)
            asked = sorted(ranks) if ranks is not None else list(range(dist.get_world_size()))
            return self._keep(asked, backend, pg_options, group)

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
                            "options_given": call["options"] is not None}
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


def rank_main(rank: int, n: int, port: int, builder: str, kwargs: dict[str, Any], timeout_s: float,
              stack: str) -> list[dict]:
    """Init a bound simulator world modelling ``stack``, run the builder, observe its groups."""
    import simulator

    torch.set_num_threads(1)
    simulator.register(stack=stack)
    simulator.register(simulator.LAZY_BACKEND_NAME, stack="nccl-lazy")  # as torch 2.15 registers nccl-lazy
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    dist.init_process_group("cpu:sim", store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=timeout_s))
    world = dist.group.WORLD
    simulator.bind_device(world)
    try:
        with Recorder() as recorder:
            load_builder(builder)(**kwargs)
        return [observe(call, rank, world) for call in recorder.calls]
    finally:
        dist.destroy_process_group()


def _child(rank: int, n: int, ports: Any, builder: str, kwargs: dict[str, Any], timeout_s: float, stack: str,
           q: Any) -> None:
    try:
        q.put((rank, "ok", rank_main(rank, n, ports.get(timeout=30), builder, kwargs, timeout_s, stack)))
    except BaseException:  # noqa: BLE001 - reported in the results
        q.put((rank, "err", traceback.format_exc()[-2000:]))


def run_ranks(builder: str, n: int, kwargs: dict[str, Any], timeout_s: float,
              stack: str) -> dict[int, tuple[str, Any]]:
    """Fork n ranks over a loopback TCPStore; {rank: ("ok", observations) | ("err", text)}."""
    results, procs = fork_and_collect(n, _child,
                                      lambda r, ports, q: (r, n, ports, builder, kwargs, timeout_s, stack, q),
                                      deadline_s=timeout_s * 4)
    for r, p in enumerate(procs):
        results.setdefault(r, ("err", f"rank {r} exited with code {p.exitcode} without a result"))
    return results


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
    if obs["comm_mode"] != "split" or obs["comm_parent"] != obs["parent_comm"]:
        problems.append(f"{where}: expected a communicator split from {obs['parent_comm']}, observed mode "
                        f"{obs['comm_mode']!r} with parent {obs['comm_parent']}")
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


def judge(results: dict[int, tuple[str, Any]], n: int, duration_s: float, target: str,
          stack: str = "torchcomms") -> list[Result]:
    """One Result per judged requirement, over every rank's observations."""
    catalog = {r.id: r for r in load_catalog()}
    errors = {r: v for r, (s, v) in results.items() if s != "ok"}
    out = []
    for rid in CHECKS:
        req = catalog[rid]
        row = {"requirement": rid, "area": req.area, "level": req.level, "world_size": n,
               "duration_s": duration_s, "target": target}
        if errors:
            ranks = [RankOutcome(r, Outcome.ERROR, f"rank {r}: {text.strip().splitlines()[-1]}", text)
                     for r, text in sorted(errors.items())]
            detail = merge_details((r.rank, r.detail) for r in ranks)
            out.append(Result(outcome=Outcome.ERROR, detail=f"the builder failed: {detail}", ranks=ranks, **row))
            continue
        groups = results[0][1]
        skip = _nothing_to_judge(rid, groups, stack)
        if skip:
            out.append(Result(outcome=Outcome.SKIP, detail=skip, **row))
            continue
        problems = distinct_details((r, p) for r in range(n) for obs in results[r][1] for p in JUDGES[rid](obs, r))
        others = sum(rid == "HINT-TORCHCOMMS-OPTIONS" and not _simulator_group(g["backend"]) for g in groups)
        detail = "; ".join(problems[:20]) if problems else f"{len(groups) - others} groups judged on {n} ranks"
        if others:  # the simulator turns options into hints on its torchcomms stack's own groups only
            detail += f" ({others} of another backend not judged: the simulator has no torchcomms routing for them)"
        out.append(Result(outcome=Outcome.FAIL if problems else Outcome.PASS, detail=detail, **row))
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
    stack = stack or default_stack()
    load_builder(builder)  # fail fast, in the parent, on a bad spec
    if not isinstance(kwargs, dict):
        raise ValueError(f"--kwargs must be a JSON object, got {kwargs!r}")
    start = time.monotonic()
    results = run_ranks(builder, world_size, kwargs, timeout_s, stack)
    return judge(results, world_size, time.monotonic() - start, f"framework-{builder}", stack)


def cmd_framework(args: argparse.Namespace) -> int:
    """Entry point of ``python -m conformance framework``."""
    from conformance.session import statements

    try:
        started = now_iso()
        results = run(args.builder, args.world_size, args.kwargs, args.timeout, args.stack)
    except ValueError as exc:
        print(f"error: {exc}")
        return ExitCode.BAD_INPUT
    target = f"framework-{args.builder}"
    extra = {"builder": args.builder, "kwargs": args.kwargs, "stack": args.stack or default_stack()}
    report = build_report(target, results, collect_environment(extra), started=started)
    json_path, md_path = write_report(report, args.report_dir, statements())
    for r in results:
        print(f"{r.requirement:<26} {r.outcome:<6} {r.detail[:200]}")
    print(f"verdict: {report['verdict']}  report: {json_path} {md_path}")
    return ExitCode.for_verdict(report["verdict"])
