"""The rank task of the defect matrix: one check with one planted defect applied (the runner's own task,
``conformance.runner.execute:run_check``, knows nothing of planted defects)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.outcomes import Outcome
from conformance.planted.mutants import by_name
from conformance.runner import execute
from simulator import faults
from simulator.defects import Defects
from simulator.patches import Patches

TASK = "conformance.planted.task:run_check"


def _recording(on: Callable[[Defects, str], bool], seen: set[str]) -> Callable[[Defects, str], bool]:
    lock = threading.Lock()  # stream threads consult too

    def recorded(self: Defects, name: str) -> bool:
        with lock:
            seen.add(name)
        return on(self, name)

    return recorded


def run_check(rank: int, world_size: int, store: Any, *, requirement_id: str, mutant: str = "",
              consulted_dir: str = "", fault: str = "", **check: Any) -> dict[str, Any]:
    """``execute.run_check`` with the named mutant planted around the check body, and with ``fault``
    (``"<rank>:<op>:<kind>"``, as SIM_FAULT takes it) planted in the simulator of this rank.

    With ``consulted_dir``, also writes ``<requirement>.rank<rank>.json`` there: the simulator defect switches
    this rank consulted while running the check. A switch never consulted cannot change what the check does,
    so the matrix runs that defect only where the clean run consulted it.
    """
    planted = by_name()[mutant] if mutant else None
    if parsed := faults.parse(fault):
        faults.plant(*parsed)
    seen: set[str] = set()
    with Patches() as patches:
        if consulted_dir:
            patches.wrap(Defects, "on", lambda on: _recording(on, seen))
        if planted is not None:
            patches.wrap(execute, "load_checks", lambda load: lambda: _planted_checks(load(), requirement_id, planted))
            patches.wrap(execute, "_quiesce_wait_s", _no_wait_once_failing)
        result = execute.run_check(rank=rank, world_size=world_size, store=store, requirement_id=requirement_id,
                                   **check)
    if consulted_dir:
        path = Path(consulted_dir) / f"{requirement_id}.rank{rank}.json"
        path.write_text(json.dumps(sorted(seen)))
    return result


def _no_wait_once_failing(wait_s: Callable[[Outcome, float, float], float]
                          ) -> Callable[[Outcome, float, float], float]:
    """The end-of-check wait for peers, skipped by a rank whose outcome already fails: a failing rank decides
    that the case catches its defect, and the matrix stops the peers (``run_case(stop_on_failure=True)``)
    instead of letting them wait out the check's timeout for it."""
    return lambda outcome, started, timeout_s: 0.0 if outcome.failing else wait_s(outcome, started, timeout_s)


def _planted_checks(checks: dict[str, Callable[..., None]], requirement_id: str,
                    planted: Any) -> dict[str, Callable[..., None]]:
    """The check registry with ``requirement_id``'s check running under ``planted``'s patches."""
    check = checks[requirement_id]

    def planted_check(ctx: Any) -> None:
        with Patches() as patches:
            planted.apply(patches)
            check(ctx)

    return {**checks, requirement_id: planted_check}
