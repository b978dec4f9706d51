"""Every planted defect the defect matrix runs: the simulator's switches, the front-end mutants and a
defective group builder, each one applied to one check at a time by ``conformance.planted.task``."""

from __future__ import annotations

import os
from dataclasses import dataclass

import simulator
from conformance.checks.derived_groups import GROUP_BUILDER_ENV
from conformance.planted import frontend
from conformance.torch_compat import defect_inapplicable
from simulator.patches import Patches


@dataclass(frozen=True)
class Mutant:
    """One planted defect: simulator switches (``defects``), a front-end mutant, or a group builder."""

    name: str
    description: str
    defects: tuple[str, ...] = ()
    frontend: str = ""
    group_builder: str = ""

    @property
    def in_simulator(self) -> bool:
        """True for a simulator switch: the backend consults it (see ``task``), so the matrix can tell which
        checks could see it."""
        return bool(self.defects)

    @property
    def recorded_as(self) -> tuple[str, ...]:
        """The names a clean run records where it could meet this mutant (``planted.task``): its switches, or
        its front-end mutant; none for the group builder (read from the environment by name: it runs against
        every requirement)."""
        return self.defects or ((self.frontend,) if self.frontend else ())

    def overridden(self) -> str:
        """The simulator methods this mutant's defects override, as ``part.method`` (for messages)."""
        return ", ".join(f"{part}.{method}" for d in self.defects
                         for part, cls in simulator.defects.DEFECTS[d].overrides.items()
                         for method, value in vars(cls).items() if callable(value) and not method.startswith("__"))

    def inapplicable(self, stack: str | None = None) -> str | None:
        """Why this mutant plants no defect on the running torch (and ``stack``), or None."""
        return next(filter(None, (defect_inapplicable(d, stack) for d in (self.name, *self.defects))), None)

    def apply(self, patches: Patches) -> None:
        """Plant the front-end mutant or the group builder (the simulator's switches travel in the sim target's
        options instead); ``patches`` undoes it."""
        if self.frontend:
            frontend.MUTANTS[self.frontend][1](patches)
        if self.group_builder:
            patches.set_item(os.environ, GROUP_BUILDER_ENV, self.group_builder)


def mutants() -> list[Mutant]:
    """Every simulator defect switch, the front-end mutants, and the derived-groups builder mutant."""
    found = [Mutant(name, d.description, defects=(name,)) for name, d in simulator.defects.DEFECTS.items()]
    found += [Mutant(name, text, frontend=name) for name, (text, _) in frontend.MUTANTS.items()]
    found.append(Mutant(
        "derived_groups_fixed_order",
        "derived groups rebuilt with a hard-coded tp-cp-ep-dp-pp order and no offset (Megatron PR 3249)",
        group_builder="conformance.planted.builders:hardcoded_order_builder",
    ))
    return found


def by_name() -> dict[str, Mutant]:
    """``mutants()`` by name."""
    return {m.name: m for m in mutants()}
