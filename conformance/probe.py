"""The probe: what a target lets a check observe about communicators and launches.

Events are plain dicts with a ``kind`` key. The kinds and their fields:

- ``comm_created``: comm (id), group (group name or None), members (global ranks,
  sorted), parent (comm id or None), mode ("eager", "lazy", "split", "p2p"),
  device (str or None), config (dict of effective options), backend (name)
- ``comm_destroyed``: comm
- ``launch``: comm, op (e.g. "allreduce", "send"), ops (number of ops in this launch),
  stream (stream id), device, backend, coalesced (bool), and optionally group (the group name:
  a non-cooperative probe sees the group a call was issued on, not the backend's communicator,
  and records the group name as comm too)
- ``config_applied``: comm, config (dict)
- ``warning``: message, category
These kind names are the one vocabulary for what can be seen: a probe lists the kinds it
records in ``Probe.observes``, and a target whose probe records kind ``k`` has the capability
``observing(k)`` = ``"observe:k"``, the name the spec's requirements use. A check that needs a
kind the probe cannot see reports not-observable.

Positive controls: a probe may also have ``control_missing(kind)``, returning None once it has
shown, in this run, that it sees events of ``kind`` (the world communicator being made, a
launch of the check's own traffic), else a sentence saying what it has not seen. A check that
claims something did NOT happen calls ``control_missing(probe, kind)`` below first and reports
not-observable when it returns a reason. The probes in conformance.probes all have it.
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
