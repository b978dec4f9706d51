"""Run one check on one rank: the task every rank process executes (pool or torchrun)."""

from __future__ import annotations

import contextlib
import datetime
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from conformance.checks.registry import CheckContext, load_checks
from conformance.outcomes import CheckFailed, NotObservable, Outcome, Skipped
from conformance.report.model import RankOutcome
from conformance.runner import worker
from conformance.runner.isolation import ProcessState
from conformance.spec import Requirement, load_catalog
from conformance.targets import make_target
from conformance.targets.base import Driver

Check = Callable[[CheckContext], None]


class CheckHooks:
    """What a caller of ``run_check`` may change about one check; the defaults change nothing. The defect
    matrix (``conformance.planted.task``) plants its defects through a subclass."""

    def check(self, requirement_id: str, check: Check) -> Check:
        """The function to run as ``requirement_id``'s check (default: the registry's ``check``)."""
        return check

    def skips_peer_wait(self, outcome: Outcome) -> bool:
        """Whether a rank whose check ended with ``outcome`` skips the end-of-check wait for its peers (an
        error always does: the runner stops the peers of a failed rank)."""
        return False

    def finished(self, driver: Driver) -> None:
        """Called once the target's driver has torn down."""


NO_HOOKS = CheckHooks()


def _requirement(requirement_id: str) -> Requirement:
    for req in load_catalog():
        if req.id == requirement_id:
            return req
    raise KeyError(f"no requirement {requirement_id!r} in the spec")


# How long a rank waits for its peers after the body, at most, and at least past the check's own timeout.
QUIESCE_MAX_S = 10.0
QUIESCE_PAST_TIMEOUT_S = 1.0


def _quiesce(store: Any, rank: int, world_size: int, wait_s: float) -> None:
    """Wait (bounded) until every rank has finished the check body, so no rank tears down
    communicators a peer is still reading from. A rank that never arrives is reported elsewhere.

    In a rank pool the ranks meet in the pool's shared memory (``worker.peer_barrier``), else (torchrun) through
    the store."""
    barrier = worker.peer_barrier(rank, world_size)
    if barrier is not None:
        barrier(wait_s)
        return
    store.set(f"done/{rank}", b"1")
    if wait_s <= 0:
        return
    with contextlib.suppress(Exception):  # a missing peer already produced its own outcome
        store.wait([f"done/{r}" for r in range(world_size)], datetime.timedelta(seconds=wait_s))


def _quiesce_wait_s(outcome: Outcome, started: float, timeout_s: float) -> float:
    """How long to wait for peers: not at all after an error (the runner stops the peers of a failed rank);
    else until shortly past the check's timeout, so that a rank whose peer hangs still reports its own
    outcome, naming the missing peer, before the runner gives up on it."""
    if outcome is Outcome.ERROR:
        return 0.0  # the runner stops the peers of a rank that errored
    past_timeout = started + timeout_s + QUIESCE_PAST_TIMEOUT_S - time.perf_counter()
    return min(QUIESCE_MAX_S, max(QUIESCE_PAST_TIMEOUT_S, past_timeout))


def _expect_record_kept(ctx: CheckContext) -> None:
    """A check that passed read the probe through its marks: a record rewritten meanwhile fails it."""
    rewritten = getattr(ctx.probe, "record_rewritten", lambda: None)()
    if rewritten is not None:
        raise CheckFailed(f"rank {ctx.rank}: target {ctx.target.name}'s probe rewrote its record during the check "
                          f"(the probe protocol's record only grows; marks index it): {rewritten}")


def run_check(
    rank: int,
    world_size: int,
    store: Any,
    requirement_id: str,
    target_name: str,
    target_options: dict[str, Any] | None = None,
    timeout_s: float = 60.0,
    hooks: CheckHooks = NO_HOOKS,
) -> dict[str, Any]:
    """Run the check bound to ``requirement_id`` on this rank; return its RankOutcome in the wire form
    (``RankOutcome.to_json``), which the pool pickles and torchrun's store carries as JSON.

    Process-wide torch state the check changes (backend registration, config flags, default group)
    is restored after it. ``hooks`` may replace the check, skip the wait for peers, and see the driver.
    """
    started = time.perf_counter()
    state = ProcessState.capture()
    target = make_target(target_name, target_options)
    driver = target.driver()
    outcome, detail, tb = Outcome.PASS, "", ""
    ctx = None
    try:
        requirement = _requirement(requirement_id)
        fn = hooks.check(requirement_id, load_checks()[requirement_id])
        driver.setup(rank, world_size)
        ctx = CheckContext(rank, world_size, driver, store, requirement, timeout_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # checks that observe warnings record their own
            fn(ctx)
        _expect_record_kept(ctx)
    except CheckFailed as exc:
        outcome, detail = Outcome.FAIL, str(exc)
    except NotObservable as exc:
        outcome, detail = Outcome.NOT_OBSERVABLE, str(exc)
    except Skipped as exc:
        declared = sorted(set(requirement.capabilities) & target.declared)
        if declared:  # declared capabilities are verified, not trusted
            outcome, detail = Outcome.FAIL, f"rank {rank}: declared capability {', '.join(declared)} but: {exc}"
        else:
            outcome, detail = Outcome.SKIP, str(exc)
    except Exception as exc:  # noqa: BLE001 - any other exception is the check's error outcome
        outcome, detail, tb = Outcome.ERROR, f"rank {rank}: {type(exc).__name__}: {exc}", traceback.format_exc()
    finally:
        wait_s = 0.0 if hooks.skips_peer_wait(outcome) else _quiesce_wait_s(outcome, started, timeout_s)
        _quiesce(store, rank, world_size, wait_s)
        try:
            driver.teardown()
        finally:
            state.restore()
        hooks.finished(driver)
    notes = ctx.notes if ctx else []
    return RankOutcome(rank, outcome, detail, tb, notes, duration_s=time.perf_counter() - started).to_json()
