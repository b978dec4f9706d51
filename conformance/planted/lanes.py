"""Run the defect matrix's cases in parallel lanes: forked processes, each with rank pools of its own.

Most of a defect's time is waiting (a peer that never arrives waits out the check's timeout), so lanes
overlap the waits. Lanes are forked before the parent starts any thread (the parent's queue feeder
thread starts with its first job), and each lane runs one case at a time through the runner's own
``run_case``, with the matrix's task (``conformance.planted.task``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import multiprocess

from conformance import interrupts
from conformance.planted.mutants import by_name
from conformance.planted.task import TASK
from conformance.runner.pool import signals_blocked
from conformance.runner.worker import STOP_SIGNALS

CTX = multiprocess.get_context("fork")


@dataclass(frozen=True)
class Case:
    """One requirement at one world size, clean (``mutant`` "") or with one planted defect; ``timeout_s`` 0: the
    lanes' own timeout."""

    requirement: str
    world_size: int
    mutant: str = ""
    timeout_s: float = 0.0


@dataclass(frozen=True)
class CaseOutcome:
    """What a lane reports for a case."""

    case: Case
    outcome: str
    detail: str
    duration_s: float


def _next(jobs: Any, parent: int) -> Case | None:
    """The next case, or None when told to stop or when the parent is gone."""
    while os.getppid() == parent:
        with contextlib.suppress(queue.Empty):
            return jobs.get(timeout=0.5)
    return None


def _lane(jobs: Any, results: Any, timeout_s: float, consulted_dir: str, stop_early: bool, stack: str,
          parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the lanes
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the pools install their cleanup on it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by the parent while it forked us
    from conformance.runner.orchestrate import run_case
    from conformance.runner.pool import PoolSet
    from conformance.session import load_bound_catalog

    catalog = {r.id: r for r in load_bound_catalog()}
    mutants = by_name()
    pools = PoolSet()
    try:
        while (case := _next(jobs, parent)) is not None:
            planted = mutants[case.mutant] if case.mutant else None
            result = run_case(pools, catalog[case.requirement], "sim", case.world_size,
                              target_options={"stack": stack, "defects": list(planted.defects if planted else ())},
                              timeout_s=case.timeout_s or timeout_s, task=TASK,
                              task_kwargs={"mutant": case.mutant, "consulted_dir": "" if planted else consulted_dir},
                              stop_on_failure=stop_early and planted is not None)
            results.put(CaseOutcome(case, result.outcome, result.detail, result.duration_s))
    finally:
        pools.close()


class Lanes:
    """``n`` lane processes; ``run(cases)`` returns every case's outcome, in any order.

    With ``stop_early``, a planted case ends soon after one of its ranks fails (the matrix needs only whether
    it fails: ``run_case(stop_on_failure=True)``, and the failing rank skips its end-of-check wait for peers).
    """

    def __init__(self, n: int, timeout_s: float, consulted_dir: str, stop_early: bool = True, stack: str = "") -> None:
        self._jobs, self._results = CTX.Queue(), CTX.Queue()
        args = (self._jobs, self._results, timeout_s, consulted_dir, stop_early, stack, os.getpid())
        self._procs = [CTX.Process(target=_lane, args=args, name=f"cfm-matrix-lane{i}") for i in range(n)]
        # A lane must not run the parent's handlers: a SIGTERM that reached it before it put its own in place was
        # only recorded there (the command line's handler), so the lane lived on until the parent's second
        # SIGTERM 20 s later, once per lane (a Ctrl-C at the matrix's start took 22-91 s to stop it).
        with signals_blocked():
            for proc in self._procs:
                proc.start()

    def run(self, cases: list[Case], each: Callable[[CaseOutcome], None] | None = None,
            wanted: Callable[[Case], bool] | None = None) -> list[CaseOutcome]:
        """Run ``cases`` on the lanes, in that order; ``each`` is called with every outcome as it comes in.

        Cases are handed out as lanes free up (one more than there are lanes is queued), so ``wanted``, asked
        just before a case is handed out, can drop it in view of the outcomes so far; dropped cases have no
        outcome in the list returned."""
        pending = iter(cases)
        in_flight = 0

        def hand_out() -> bool:
            for case in pending:
                if wanted is None or wanted(case):
                    with interrupts.deferred():  # a Ctrl-C inside put() left the queue's lock held: close() hung
                        self._jobs.put(case)
                    return True
            return False

        while in_flight <= len(self._procs) and hand_out():
            in_flight += 1
        done: list[CaseOutcome] = []
        while in_flight:
            try:
                outcome = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in self._procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"matrix lane {dead[0].name} died (exit code {dead[0].exitcode})") from None
                continue
            done.append(outcome)
            in_flight -= 1
            if each is not None:
                each(outcome)
            if hand_out():
                in_flight += 1
        return done

    def close(self, at_once: bool = False) -> None:
        """Stop the lanes (each closes its pools): after their current case, or ``at_once`` (SIGTERM, which
        makes a lane close its pools and exit); kill, by pid, any that does not stop in time."""
        for proc in self._procs:
            if proc.is_alive() and at_once:
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGTERM)
            elif proc.is_alive():
                with contextlib.suppress(Exception):
                    self._jobs.put(None)
        for proc in self._procs:
            proc.join(20.0)
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGTERM)
                proc.join(5.0)
        for q in (self._jobs, self._results):  # cases nobody will take must not hold this process at exit
            q.cancel_join_thread()
            q.close()
