"""Outcomes a check can end with, and the exceptions a check raises to say so."""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """The outcome of one requirement on one target at one world size."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"
    NOT_OBSERVABLE = "not-observable"
    WAIVED = "waived"


class CheckFailed(AssertionError):
    """The target was observed violating the requirement."""


class NotObservable(Exception):
    """The target cannot show what the check needs; never reported as a pass."""


class Skipped(Exception):
    """The requirement does not apply here (capability, world size, torch version)."""
