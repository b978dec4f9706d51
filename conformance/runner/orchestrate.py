"""Parent side: run one requirement on one target at one world size and turn rank reports into a Result."""

from __future__ import annotations

import time
from typing import Any

import torch

from conformance.outcomes import Outcome
from conformance.report.model import Result
from conformance.runner.pool import PoolSet, RankReport
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
    reason = target.unavailable_reason()
    if reason is None and hasattr(target, "unavailable_reason_for"):
        reason = target.unavailable_reason_for(world_size)
    if reason:
        return Outcome.SKIP, f"target {target_name} unavailable: {reason}"
    if not requirement.applies_to_torch(torch.__version__):
        return Outcome.SKIP, f"requirement applies to torch {requirement.torch}, not {torch.__version__}"
    if not requirement.applies_to_world_size(world_size):
        return Outcome.SKIP, f"requirement runs at world sizes {list(requirement.world_sizes)} only"
    missing = [c for c in requirement.capabilities if c not in target.capabilities]
    observe = [c for c in missing if c.startswith("observe:")]
    if missing and len(observe) < len(missing):
        other = [c for c in missing if c not in observe]
        return Outcome.SKIP, f"target {target_name} lacks capability {', '.join(other)}"
    if observe:
        return Outcome.NOT_OBSERVABLE, f"target {target_name} cannot observe {', '.join(observe)}"
    return None


def aggregate(reports: list[RankReport]) -> tuple[Outcome, str, list[dict[str, Any]]]:
    """Combine per-rank reports: crashes and timeouts are errors naming the rank; else the worst outcome."""
    ranks: list[dict[str, Any]] = []
    outcomes: list[Outcome] = []
    details: list[str] = []
    for rep in reports:
        if rep.status == "ok":
            value = rep.value
            outcome = Outcome(value["outcome"])
            entry = {"rank": rep.rank, "outcome": outcome.value, "detail": value["detail"],
                     "traceback": value["traceback"], "notes": value["notes"]}
            if outcome not in (Outcome.PASS, Outcome.SKIP, Outcome.NOT_OBSERVABLE) or value["detail"]:
                details.append(value["detail"])
        else:
            outcome = Outcome.ERROR
            what = {"raised": "raised", "crashed": "crashed", "timeout": "timed out",
                    "aborted": "was abandoned after a peer failed"}.get(rep.status, rep.status)
            text = f"rank {rep.rank} {what}: {rep.error}".rstrip(": ")
            details.append(text)
            entry = {"rank": rep.rank, "outcome": "error", "detail": text, "traceback": rep.traceback,
                     "notes": [], "status": rep.status, "exitcode": rep.exitcode}
        outcomes.append(outcome)
        ranks.append(entry)
    worst = min(outcomes, key=_SEVERITY.index) if outcomes else Outcome.ERROR
    unique = list(dict.fromkeys(d for d in details if d))
    if worst in (Outcome.SKIP, Outcome.NOT_OBSERVABLE, Outcome.PASS):
        unique = list(dict.fromkeys(r["detail"] for r in ranks if r["outcome"] == worst.value and r["detail"]))
    return worst, "; ".join(unique), ranks


def run_case(pools: PoolSet, requirement: Requirement, target_name: str, world_size: int, *,
             target_options: dict[str, Any] | None = None, timeout_s: float = 60.0,
             env: dict[str, str] | None = None) -> Result:
    """Run ``requirement`` on ``target_name`` at ``world_size`` and return its Result."""
    started = time.perf_counter()
    decided = precheck(requirement, target_name, target_options, world_size)
    ranks: list[dict[str, Any]] = []
    notes: list[str] = []
    if decided is not None:
        outcome, detail = decided
    else:
        reports = pools.get(world_size).run(
            TASK,
            {"requirement_id": requirement.id, "target_name": target_name,
             "target_options": target_options, "timeout_s": timeout_s, "env": env},
            timeout_s + POOL_GRACE_S,
        )
        outcome, detail, ranks = aggregate(reports)
        notes = list(dict.fromkeys(n for r in ranks for n in r.get("notes", [])))
    return Result(
        requirement=requirement.id, area=requirement.area, level=requirement.level, world_size=world_size,
        outcome=outcome.value, detail=detail, duration_s=round(time.perf_counter() - started, 4),
        target=target_name, ranks=ranks, notes=notes,
    )
