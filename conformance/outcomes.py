"""Outcomes a check can end with, and the exceptions a check raises to say so.

This is the only module that spells an outcome's string: everything else uses the members, and
reads a stored outcome back with ``Outcome(value)``.
"""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """The outcome of one requirement on one target at one world size (or on one rank)."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"
    NOT_OBSERVABLE = "not-observable"
    WAIVED = "waived"

    @property
    def failing(self) -> bool:
        """True for fail and error: the requirement was not met (a waiver may still cover it)."""
        return self in (Outcome.FAIL, Outcome.ERROR)

    @property
    def severity(self) -> int:
        """How serious the outcome is; when ranks or world sizes disagree, the highest wins.

        error > fail > not-observable > skip > waived > pass.
        """
        return _SEVERITY[self]


_SEVERITY = {o: i for i, o in enumerate(reversed((Outcome.ERROR, Outcome.FAIL, Outcome.NOT_OBSERVABLE, Outcome.SKIP,
                                                  Outcome.WAIVED, Outcome.PASS)))}


def worst(outcomes: list[Outcome]) -> Outcome:
    """The most serious of ``outcomes`` (error when there are none: nothing was reported)."""
    return max(outcomes, key=lambda o: o.severity, default=Outcome.ERROR)


class CheckFailed(AssertionError):
    """The target was observed violating the requirement."""


class NotObservable(Exception):
    """The target cannot show what the check needs; never reported as a pass."""


class Skipped(Exception):
    """The requirement does not apply here (capability, world size, torch version)."""
