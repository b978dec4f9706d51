"""Parent side: run one requirement on one target at one world size and turn rank reports into a Result."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from conformance.outcomes import Outcome
from conformance.report.model import Result
from conformance.runner.pool import GPU_START_METHOD, PoolSet, RankReport
from conformance.spec import Requirement
from conformance.targets import make_target

TASK = "conformance.runner.execute:run_check"
# A rank still running this long after the check's own timeout is hung: its stack is taken and the pool rebuilt.
POOL_GRACE_S = 5.0
# Which rank outcome wins when ranks disagree: the most serious first.
_SEVERITY = [Outcome.ERROR, Outcome.FAIL, Outcome.NOT_OBSERVABLE, Outcome.SKIP, Outcome.PASS]


def precheck(requirement: Requirement, target_name: str, target_options: dict[str, Any] | None,
             world_size: int) -> tuple[Outcome, str] | None:
    """An outcome decided without running anything (unavailable target, missing capability), or None."""
    target = make_target(target_name, target_options)
    reason = target.unavailable_reason(world_size)
    if reason:
        reason = f"target {target_name} unavailable: {reason}"
    elif inapplicable := target.not_applicable.get(requirement.id):
        reason = f"requirement does not apply on target {target_name}: {inapplicable}"
    if reason:
        return Outcome.SKIP, reason
    if not requirement.applies_to_torch(torch.__version__):
        return Outcome.SKIP, f"requirement applies to torch {requirement.torch}, not {torch.__version__}"
    if not requirement.applies_to_world_size(world_size):
        return Outcome.SKIP, (f"requirement runs at world sizes {list(requirement.world_sizes)} only"
                              if requirement.world_sizes else "requirement needs at least 2 ranks")
    missing = [c for c in requirement.capabilities if c not in target.capabilities]
    observe = [c for c in missing if c.startswith("observe:")]
    if missing and len(observe) < len(missing):
        other = [c for c in missing if c not in observe]
        return Outcome.SKIP, f"target {target_name} lacks capability {', '.join(other)}"
    if observe:
        return Outcome.NOT_OBSERVABLE, f"target {target_name} cannot observe {', '.join(observe)}"
    return None


def _entry(rep: RankReport) -> dict[str, Any]:
    """A rank's outcome dict: run_check's value, or an error entry naming how the rank failed."""
    if rep.status == "ok":
        return dict(rep.value)
    what = {"raised": "raised", "crashed": "crashed", "timeout": "timed out",
            "aborted": "was abandoned after a peer failed"}.get(rep.status, rep.status)
    return {"rank": rep.rank, "outcome": "error", "detail": f"rank {rep.rank} {what}: {rep.error}".rstrip(": "),
            "traceback": rep.traceback, "notes": [], "status": rep.status, "exitcode": rep.exitcode}


def _hung(rep: RankReport, timeout_s: float) -> RankReport:
    """A rank abandoned after a peer failed, but only past the check's own timeout (which bounds every wait
    of a check), is itself hung: it is reported as timed out, not as a casualty of its peer."""
    if rep.status != "aborted" or rep.duration_s < timeout_s:
        return rep
    return replace(rep, status="timeout",
                   error=f"no result after {rep.duration_s:.1f} s (the check's timeout is {timeout_s:g} s)")


def aggregate_values(values: list[dict[str, Any]]) -> tuple[Outcome, str, list[dict[str, Any]]]:
    """Combine per-rank outcome dicts: the worst outcome wins; its details are kept, once each."""
    ranks = [{k: v[k] for k in v if k != "duration_s"} for v in values]
    outcomes = [Outcome(v["outcome"]) for v in values]
    worst = min(outcomes, key=_SEVERITY.index) if outcomes else Outcome.ERROR
    if worst in (Outcome.SKIP, Outcome.NOT_OBSERVABLE, Outcome.PASS):
        details = [r["detail"] for r in ranks if r["outcome"] == worst.value]
    else:
        details = [r["detail"] for r in ranks if r["outcome"] in ("fail", "error")]
    return worst, "; ".join(dict.fromkeys(d for d in details if d)), ranks


def aggregate(reports: list[RankReport]) -> tuple[Outcome, str, list[dict[str, Any]]]:
    """Combine per-rank reports: crashes and timeouts are errors naming the rank; else the worst outcome."""
    return aggregate_values([_entry(rep) for rep in reports])


def case_result(requirement: Requirement, target_name: str, world_size: int, outcome: Outcome, detail: str,
                duration_s: float, ranks: list[dict[str, Any]] | None = None) -> Result:
    """The Result of one case; the notes are the ranks' notes, once each."""
    ranks = ranks or []
    return Result(
        requirement=requirement.id, area=requirement.area, level=requirement.level, world_size=world_size,
        outcome=outcome.value, detail=detail, duration_s=round(duration_s, 4), target=target_name, ranks=ranks,
        notes=list(dict.fromkeys(n for r in ranks for n in r.get("notes", []))),
    )


def run_case(pools: PoolSet, requirement: Requirement, target_name: str, world_size: int, *,
             target_options: dict[str, Any] | None = None, timeout_s: float = 60.0,
             env: dict[str, str] | None = None) -> Result:
    """Run ``requirement`` on ``target_name`` at ``world_size`` and return its Result."""
    started = time.perf_counter()
    decided = precheck(requirement, target_name, target_options, world_size)
    if decided is not None:
        return case_result(requirement, target_name, world_size, *decided, time.perf_counter() - started)
    target = make_target(target_name, target_options)
    start_method = GPU_START_METHOD if target.gpu else None
    # A target names the checks that must not share rank processes (a once-per-process warning, a
    # possible device hang): those get a pool of their own, closed after the check.
    isolated = requirement.id in target.fresh_process_checks
    pool = pools.fresh(world_size, start_method) if isolated else pools.get(world_size, start_method)
    pool.on_kill(target_name, target.cleanup)  # what killed ranks of this target leave behind
    try:
        reports = pool.run(
            TASK,
            {"requirement_id": requirement.id, "target_name": target_name,
             "target_options": target_options, "timeout_s": timeout_s, "env": env},
            timeout_s + POOL_GRACE_S,
            failed=lambda value: isinstance(value, dict) and value.get("outcome") == Outcome.ERROR.value,
        )
    finally:
        if isolated:
            pool.close()
    outcome, detail, ranks = aggregate([_hung(rep, timeout_s) for rep in reports])
    return case_result(requirement, target_name, world_size, outcome, detail, time.perf_counter() - started, ranks)
