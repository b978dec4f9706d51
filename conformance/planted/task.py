"""The rank task of the defect matrix: one check with one planted defect applied, through the runner's
seam (``conformance.runner.execute.CheckHooks``); the runner's own task knows nothing of planted defects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conformance.outcomes import Outcome
from conformance.planted.frontend import record_reached
from conformance.planted.mutants import Mutant, by_name
from conformance.runner import execute
from conformance.targets.base import Driver
from simulator import faults
from simulator.patches import Patches

TASK = "conformance.planted.task:run_check"


class PlantedHooks(execute.CheckHooks):
    """Runs the check under ``planted``'s front-end or builder patches; a rank whose outcome already fails
    skips the wait for peers (a failing rank decides that the case catches its defect, and the matrix stops
    the peers, ``run_case(stop_on_failure=True)``); with ``consulted``, writes there the simulator defects
    the rank's backend could have met (``SimDriver.consulted``) and the front-end mutants whose functions the
    check called (``frontend.record_reached``)."""

    def __init__(self, planted: Mutant | None, consulted: Path | None) -> None:
        self.planted = planted
        self.consulted = consulted
        self.reached: set[str] = set()

    def check(self, requirement_id: str, check: execute.Check) -> execute.Check:
        if self.planted is None:
            if self.consulted is None:
                return check

            def recorded_check(ctx: Any) -> None:
                with Patches() as patches:
                    record_reached(patches, self.reached)
                    check(ctx)

            return recorded_check
        planted = self.planted

        def planted_check(ctx: Any) -> None:
            with Patches() as patches:
                planted.apply(patches)
                check(ctx)

        return planted_check

    def skips_peer_wait(self, outcome: Outcome) -> bool:
        return self.planted is not None and outcome.failing

    def finished(self, driver: Driver) -> None:
        if self.consulted is not None:
            met = set(getattr(driver, "consulted", None) or ()) | self.reached
            self.consulted.write_text(json.dumps(sorted(met)))


def run_check(rank: int, world_size: int, store: Any, *, requirement_id: str, mutant: str = "",
              consulted_dir: str = "", fault: str = "", **check: Any) -> dict[str, Any]:
    """``execute.run_check`` with the named mutant planted around the check body, and with ``fault``
    (``"<rank>:<op>:<kind>"``, as SIM_FAULT takes it) planted in the simulator of this rank.

    With ``consulted_dir``, also writes ``<requirement>.rank<rank>.json`` there: the simulator defects whose
    overridden methods this rank's backend ran during the check, and the front-end mutants whose functions the
    check called. A defect never met cannot change what the check does, so the matrix runs that defect only
    where the clean run met it.
    """
    if parsed := faults.parse(fault):
        faults.plant(*parsed)
    consulted = Path(consulted_dir) / f"{requirement_id}.rank{rank}.json" if consulted_dir else None
    if consulted is not None:
        check["target_options"] = {**(check.get("target_options") or {}), "record_consulted": True}
    hooks = PlantedHooks(by_name()[mutant] if mutant else None, consulted)
    return execute.run_check(rank=rank, world_size=world_size, store=store, requirement_id=requirement_id,
                             hooks=hooks, **check)
