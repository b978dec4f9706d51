"""toyccl's own record of its communicators (what ``conformance_probe()`` hands the suite)."""

from __future__ import annotations

from typing import Any


class CommLog:
    """``comm_created`` and ``config_applied`` events of this process, in order."""

    observes = frozenset({"comm_created", "config_applied"})

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []

    def record(self, kind: str, **fields: Any) -> None:
        """Append one event."""
        self._events.append({"kind": kind, **fields})

    def events(self, kind: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        """Events (of one kind) from index ``since``."""
        return [e for e in self._events[since:] if kind is None or e["kind"] == kind]

    def mark(self) -> int:
        """An index for ``since``."""
        return len(self._events)

    def clear(self) -> None:
        """Forget every event."""
        self._events.clear()


LOG = CommLog()
