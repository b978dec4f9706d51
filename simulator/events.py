"""The simulator's per-process event log (implements conformance's Probe protocol)."""

from __future__ import annotations

import warnings
from typing import Any

KINDS = frozenset({"comm_created", "comm_destroyed", "launch", "config_applied", "warning"})


class EventLog:
    """Rank-local list of events: communicators created/split/destroyed, launches, config, warnings."""

    observes = KINDS

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []

    def record(self, kind: str, **fields: Any) -> None:
        """Append one event."""
        self._events.append({"kind": kind, **fields})

    def warn(self, message: str, category: type[Warning] = UserWarning) -> None:
        """Issue a Python warning and record it."""
        self.record("warning", message=message, category=category.__name__)
        warnings.warn(message, category, stacklevel=3)

    def events(self, kind: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        """Events from index ``since``, optionally of one kind."""
        return [e for e in self._events[since:] if kind is None or e["kind"] == kind]

    def mark(self) -> int:
        """Index of the next event."""
        return len(self._events)

    def clear(self) -> None:
        """Forget all events."""
        self._events.clear()


LOG = EventLog()
