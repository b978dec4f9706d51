"""The per-mutant judge: the verdict of `run` / `certify` on a target, stopping at the first failing MUST.

Run as ``python -m conformance.mutation.judge TARGET`` in the root of a tree (a copy holding one mutant): every
requirement at the smallest world size first, then at the next, in catalog order, as ``session.run_suite``
does per requirement; it stops at the first backend MUST whose outcome (the target's waivers applied) fails or
errors, the case that makes the verdict non-conformant. Prints one JSON line; exits 0 when the verdict is
conformant (with or without waivers), 1 when non-conformant or incomplete, 5 when the code under judgement
is not the tree's own (the mutant would not be what the ranks run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from conformance import inputs
from conformance.import_probe import probe_import
from conformance.mutation.targets import TARGETS, MutationTarget
from conformance.outcomes import Outcome
from conformance.report import Result, compute_verdict
from conformance.report.build import Verdict
from conformance.runner.orchestrate import run_case
from conformance.runner.pool import PoolSet
from conformance.session import Selection, judge, load_bound_catalog, load_target_expectations

NOT_THE_TREE = 5
STACK_TAIL = 1200  # characters kept of a stuck rank's stack dump


def imported_from(target: MutationTarget, root: Path) -> str:
    """Where the target's package is imported from; empty when it lies under ``root / target.source``."""
    package = Path(target.source).name
    spec = importlib.util.find_spec(package)
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    inside = origin is not None and (root / target.source).resolve() in origin.parents
    return "" if inside else str(origin)


def _fails_a_must(result: Result, kinds: dict[str, str]) -> bool:
    return result.level == "MUST" and kinds.get(result.requirement) == "backend" and result.outcome.failing


def _stuck(result: Result) -> dict[str, dict[int, str]]:
    """Where each rank the runner gave up on (timed out, or abandoned after a peer failed) was: the end of its
    stack dump, so that a kill by a hang can be told from a flake of the machine."""
    stuck = {r.rank: r.traceback[-STACK_TAIL:] for r in result.ranks if r.status in ("timeout", "aborted")}
    return {"stacks": stuck} if stuck else {}


def target_options(target: MutationTarget, root: Path, stack: str = "") -> dict[str, Any] | None:
    """The suite target's options: the target's own, with what the backend declares in its capabilities file
    (``capabilities`` and ``options_factory``, as ``certify --capabilities-file`` reads them) and the simulator
    ``stack`` to judge on (as ``run --stack``; empty: the target's default)."""
    declared = tomllib.loads((root / target.capabilities_file).read_text()) if target.capabilities_file else {}
    return {**target.options, **declared, **({"stack": stack} if stack else {})} or None


def judge_target(target: MutationTarget, world_sizes: list[int], timeout_s: float,
                 only: tuple[str, ...] = (), root: Path | None = None, stack: str = "") -> dict[str, Any]:
    """Run the suite (``only`` these requirements, if given) on ``target`` (on the simulator ``stack``, if given)
    until its first failing backend MUST; the verdict and that case."""
    if target.import_module:
        problem = probe_import(target.import_module, target.options["backend"], timeout_s)
        if problem:  # certify refuses such a module (exit 2): the mutant is caught before any check
            return {"verdict": "import-refused", "first_failure": {"detail": problem[:400]}}
    catalog = Selection(ids=only).pick(load_bound_catalog())
    kinds = {r.id: r.kind for r in catalog}
    expectations = load_target_expectations(target.suite_target)
    options = target_options(target, root or Path.cwd(), stack)
    results: list[Result] = []
    pools = PoolSet()
    try:
        for n in sorted(set(world_sizes)):
            for req in catalog:
                if not req.applies_to_world_size(n):
                    continue
                raw = run_case(pools, req, target.suite_target, n, target_options=options, timeout_s=timeout_s,
                               stop_on_failure=req.level == "MUST")
                (result,), _ = judge([raw], expectations)
                results.append(result)
                if _fails_a_must(result, kinds):
                    return {"verdict": str(Verdict.NON_CONFORMANT), "cases": len(results),
                            "first_failure": {"requirement": result.requirement, "world_size": n,
                                              "outcome": result.outcome.value, "detail": result.detail[:400],
                                              **_stuck(result)}}
    finally:
        pools.close()
    return {"verdict": str(compute_verdict(results, interrupted=False)), "cases": len(results),
            "unjudged_musts": sorted({r.requirement for r in results
                                      if r.level == "MUST" and kinds[r.requirement] == "backend"
                                      and not (r.outcome.failing or r.outcome is Outcome.PASS)})}


def main(argv: list[str] | None = None) -> int:
    """Entry point: judge the tree in the current directory."""
    parser = argparse.ArgumentParser(prog="python -m conformance.mutation.judge", description=__doc__)
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--world-sizes", type=inputs.world_sizes, default=[2, 4])
    parser.add_argument("--timeout", type=inputs.timeout, default=8.0, help="per-check timeout in seconds")
    parser.add_argument("--requirement", default="", help="only these requirement ids (comma-separated)")
    parser.add_argument("--stack", default="", help="the simulator stack to judge on (default: the torch's own)")
    args = parser.parse_args(argv)
    target = TARGETS[args.target]
    if args.stack and args.stack not in target.stacks:
        parser.error(f"--stack {args.stack!r}: target {target.name} is judged on "
                     f"{', '.join(target.stacks) or 'its one stack'}")
    elsewhere = imported_from(target, Path.cwd())
    if elsewhere:
        print(json.dumps({"verdict": "not-the-tree", "imported_from": elsewhere}))
        return NOT_THE_TREE
    only = tuple(r.strip() for r in args.requirement.split(",") if r.strip())
    outcome = judge_target(target, args.world_sizes, args.timeout, only, Path.cwd(), args.stack)
    print(json.dumps(outcome), flush=True)
    return 0 if outcome["verdict"] in (Verdict.CONFORMANT, Verdict.CONFORMANT_WITH_WAIVERS) else 1


if __name__ == "__main__":
    sys.exit(main())
