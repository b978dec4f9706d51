"""Parent side: run one requirement on one target at one world size and turn its RankOutcomes into a Result."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from conformance import outcomes
from conformance.outcomes import Outcome
from conformance.report.details import merge_details
from conformance.report.model import RankOutcome, Result
from conformance.runner.messages import RankStatus
from conformance.runner.pool import GPU_START_METHOD, PoolSet, RankReport
from conformance.spec import Requirement
from conformance.targets import make_target

TASK = "conformance.runner.execute:run_check"
# A rank still running this long after the check's own timeout is hung: its stack is taken and the pool rebuilt.
POOL_GRACE_S = 5.0


def precheck(requirement: Requirement, target_name: str, target_options: dict[str, Any] | None,
             world_size: int) -> tuple[Outcome, str] | None:
    """An outcome decided without running anything (unavailable target, missing capability), or None."""
    target = make_target(target_name, target_options)
    reason = target.unavailable_reason(world_size)
    if reason:
        reason = f"target {target_name} unavailable: {reason}"
    elif inapplicable := requirement.not_on_stack(target.stack):
        reason = f"requirement does not apply on stack {target.stack}: {inapplicable}"
    if reason:
        return Outcome.SKIP, reason
    if not requirement.applies_to_torch(torch.__version__):
        return Outcome.SKIP, f"requirement applies to torch {requirement.torch}, not {torch.__version__}"
    if not requirement.applies_to_world_size(world_size):
        return Outcome.SKIP, (f"requirement runs at world sizes {list(requirement.world_sizes)} only"
                              if requirement.world_sizes
                              else f"requirement needs at least {requirement.min_world_size} ranks")
    missing = [c for c in requirement.capabilities if c not in target.capabilities]
    observe = [c for c in missing if c.startswith("observe:")]
    if missing and len(observe) < len(missing):
        other = [c for c in missing if c not in observe]
        return Outcome.SKIP, f"target {target_name} lacks capability {', '.join(other)}"
    if observe:
        return Outcome.NOT_OBSERVABLE, f"target {target_name} cannot observe {', '.join(observe)}"
    return None


def rank_outcome(rep: RankReport) -> RankOutcome:
    """A rank's outcome: the one run_check returned, or an error naming how the rank's process failed."""
    if rep.status is RankStatus.OK:
        return RankOutcome.from_json(rep.value)
    return RankOutcome(rep.rank, Outcome.ERROR, detail=f"rank {rep.rank} {rep.status.verb}: {rep.error}".rstrip(": "),
                       traceback=rep.traceback, status=rep.status, exitcode=rep.exitcode)


def _hung(rep: RankReport, timeout_s: float) -> RankReport:
    """A rank abandoned after a peer failed, but only past the check's own timeout (which bounds every wait
    of a check), is itself hung: it is reported as timed out, not as a casualty of its peer."""
    if rep.status is not RankStatus.ABORTED or rep.duration_s < timeout_s:
        return rep
    return replace(rep, status=RankStatus.TIMEOUT,
                   error=f"no result after {rep.duration_s:.1f} s (the check's timeout is {timeout_s:g} s)")


def aggregate(ranks: list[RankOutcome]) -> tuple[Outcome, str]:
    """Combine the ranks' outcomes: the most severe wins; the details of the ranks that decided it
    (every failing rank when it is a failure), each distinct message once, naming its ranks."""
    worst = outcomes.worst([r.outcome for r in ranks])
    deciding = [r for r in ranks if (r.outcome.failing if worst.failing else r.outcome is worst)]
    return worst, merge_details((r.rank, r.detail) for r in deciding)


def case_result(requirement: Requirement, target_name: str, world_size: int, outcome: Outcome, detail: str,
                duration_s: float, ranks: list[RankOutcome] | None = None) -> Result:
    """The Result of one case; the notes are the ranks' notes, once each (the report keeps the case's
    duration, not each rank's)."""
    ranks = [replace(r, duration_s=None) for r in ranks or ()]
    return Result(
        requirement=requirement.id, area=requirement.area, level=requirement.level, world_size=world_size,
        outcome=outcome, detail=detail, duration_s=round(duration_s, 4), target=target_name, ranks=ranks,
        notes=list(dict.fromkeys(n for r in ranks for n in r.notes)),
    )


def run_case(pools: PoolSet, requirement: Requirement, target_name: str, world_size: int, *,
             target_options: dict[str, Any] | None = None, timeout_s: float = 60.0,
             task: str = TASK, task_kwargs: dict[str, Any] | None = None, stop_on_failure: bool = False) -> Result:
    """Run ``requirement`` on ``target_name`` at ``world_size`` and return its Result.

    ``task`` (``"package.module:function"``) is what every rank runs, ``TASK`` or one that wraps it (the defect
    matrix's); it gets ``task_kwargs`` on top of ``TASK``'s arguments. The other ranks are stopped soon after
    one rank's outcome is an error, or with ``stop_on_failure`` any failing outcome (for a caller that needs
    only whether the case fails, not every rank's account of it).
    """
    started = time.perf_counter()
    decided = precheck(requirement, target_name, target_options, world_size)
    if decided is not None:
        return case_result(requirement, target_name, world_size, *decided, time.perf_counter() - started)
    target = make_target(target_name, target_options)
    start_method = GPU_START_METHOD if target.gpu else None
    # A target names the checks that must not share rank processes (a once-per-process warning, a
    # possible device hang): those get a pool of their own, closed after the check.
    isolated = target.isolates(requirement)
    pool = pools.fresh(world_size, start_method) if isolated else pools.get(world_size, start_method)
    pool.on_kill(target_name, target.cleanup)  # what killed ranks of this target leave behind
    try:
        reports = pool.run(
            task,
            {"requirement_id": requirement.id, "target_name": target_name,
             "target_options": target_options, "timeout_s": timeout_s, **(task_kwargs or {})},
            timeout_s + POOL_GRACE_S,
            failed=lambda value: (Outcome(value["outcome"]).failing if stop_on_failure
                                  else Outcome(value["outcome"]) is Outcome.ERROR),
        )
    finally:
        if isolated:
            pool.close()
    ranks = [rank_outcome(_hung(rep, timeout_s)) for rep in reports]
    return case_result(requirement, target_name, world_size, *aggregate(ranks), time.perf_counter() - started,
                       ranks)
