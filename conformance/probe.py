"""The probe: what a target lets a check observe about communicators and launches.

Events are plain dicts with a ``kind`` key (``EVENT_KINDS``); a target whose probe records kind ``k`` has
capability ``observe:k``. The fields of each kind and the positive controls: conformance/probes/README.md
("Events"). A probe cannot report what it has not shown it sees: a check asserting absence asks
``control_missing`` first.
"""

from __future__ import annotations

from typing import Any, Protocol

Event = dict[str, Any]

EVENT_KINDS = ("comm_created", "comm_destroyed", "launch", "config_applied", "warning")
OBSERVE = "observe:"


def observing(kind: str) -> str:
    """The capability of a target whose probe records events of ``kind``."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(EVENT_KINDS)}")
    return OBSERVE + kind


class Probe(Protocol):
    """Rank-local view of what the backend under test did."""

    observes: frozenset[str]

    def events(self, kind: str | None = None, since: int = 0) -> list[Event]:
        """Events recorded on this rank (of one kind, from index ``since``)."""

    def mark(self) -> int:
        """An index to pass as ``since`` to see only later events."""


def control_missing(probe: Probe, kind: str) -> str | None:
    """Why ``probe`` cannot back a claim that no ``kind`` event happened in this run, or None."""
    if kind not in probe.observes:
        return f"the probe does not observe {kind} events"
    check = getattr(probe, "control_missing", None)
    return check(kind) if check is not None else None


class NullProbe:
    """A probe that observes nothing (real stacks without instrumentation)."""

    observes: frozenset[str] = frozenset()

    def events(self, kind: str | None = None, since: int = 0) -> list[Event]:
        return []

    def mark(self) -> int:
        return 0
