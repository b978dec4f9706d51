"""Event lists, the probe boundary, and the combination of several probes into one (conformance.probe).

The probe boundary: a probe's own code runs inside the backend's calls (a wrapped method, a dispatch
mode) and around ``init_process_group``; an exception there is the suite's fault, not the backend's.
``RecordingProbe.boundary(kind)`` catches it and keeps it as the reason the probe's ``kind`` events
cannot be trusted in this check; from then on ``events(kind)`` raises ``ProbeFault`` (a
``NotObservable``) and ``control_missing(kind)`` returns that reason, so the case is reported
not-observable naming the probe's fault, and the backend's call goes on as if no probe were there.
The lifecycle hooks (``start``, ``attach_store``, ``world_created``, ``flush``) of every subclass run
inside the boundary too.
"""

from __future__ import annotations

import contextlib
import functools
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from conformance.outcomes import NotObservable
from conformance.probe import Event

# The lifecycle hooks a subclass may define; each runs inside the probe boundary (see __init_subclass__).
_HOOKS = ("start", "attach_store", "world_created", "flush")


class ProbeFault(NotObservable):
    """A probe of the suite faulted: what it would have recorded is not observable in this check."""


def _where(exc: BaseException) -> str:
    """``file.py:line`` of the innermost frame that raised ``exc``."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"


def _guarded_hook(name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` run inside the probe boundary for every kind the probe observes; on a fault it returns
    what the base class's no-op would (the probe for ``start``, the store itself for ``attach_store``)."""

    @functools.wraps(hook)
    def guarded(self: RecordingProbe, *args: Any) -> Any:
        try:
            return hook(self, *args)
        except Exception as exc:  # noqa: BLE001 - the boundary: any fault of the probe is the suite's
            self.fault(None, exc, during=name)
            return getattr(RecordingProbe, name)(self, *args)

    return guarded


class RecordingProbe:
    """A probe that keeps its events in a list; subclasses call ``record`` and may override ``flush``.

    Its life on a rank, driven by conformance.targets.base.Driver: ``start()`` before the check,
    ``attach_store(store)`` and ``world_created(world)`` around ``init_process_group``, ``close()``
    after the check. Each is a no-op unless the probe needs it.
    """

    observes: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _HOOKS:
            if name in vars(cls):
                setattr(cls, name, _guarded_hook(name, vars(cls)[name]))

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._faults: dict[str, str] = {}  # event kind -> why this probe cannot be trusted with it

    def fault(self, kind: str | None, exc: BaseException, during: str) -> None:
        """Keep the first fault of the probe's own code for ``kind`` (every kind it observes when None)."""
        why = (f"the suite's {type(self).__name__} faulted during {during}: {type(exc).__name__}: {exc} "
               f"(at {_where(exc)}); a fault of the conformance suite, not of the backend")
        for k in self.observes if kind is None else (kind,):
            self._faults.setdefault(k, why)

    @contextlib.contextmanager
    def boundary(self, kind: str, during: str = "recording") -> Iterator[None]:
        """Run the probe's own code for ``kind`` events: an exception in it is kept as a fault, not raised."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - the boundary: any fault of the probe is the suite's
            self.fault(kind, exc, during)

    def faulted(self, kind: str) -> str | None:
        """Why this probe's ``kind`` events cannot be trusted in this check, or None."""
        return self._faults.get(kind)

    def record(self, kind: str, **fields: Any) -> Event:
        """Append one event of ``kind``."""
        event = {"kind": kind, **fields}
        self._events.append(event)
        return event

    def start(self) -> RecordingProbe:
        """Install whatever the probe watches with; returns the probe."""
        return self

    def attach_store(self, store: dist.Store) -> dist.Store:
        """The store ``init_process_group`` gets: ``store`` itself, or a wrapper that watches it."""
        return store

    def world_created(self, world: dist.ProcessGroup) -> None:
        """Called with the default group once ``init_process_group`` returned."""

    def flush(self) -> None:
        """Bring lazily gathered events up to date (a no-op unless a subclass gathers lazily)."""

    def events(self, kind: str | None = None, since: int = 0) -> list[Event]:
        """Events recorded on this rank (of one kind, from index ``since``); ProbeFault where the probe faulted."""
        self.flush()
        why = next(iter(self._faults.values()), None) if kind is None else self._faults.get(kind)
        if why is not None:
            raise ProbeFault(why)
        return [e for e in self._events[since:] if kind is None or e["kind"] == kind]

    def mark(self) -> int:
        """An index to pass as ``since`` to see only later events."""
        self.flush()
        return len(self._events)

    def control_missing(self, kind: str) -> str | None:
        """None when this run showed the probe seeing ``kind`` at all, else what it did not see."""
        if kind not in self.observes:
            return f"{type(self).__name__} does not observe {kind} events"
        if kind in self._faults:
            return self._faults[kind]
        return None if any(e["kind"] == kind for e in self.events(kind)) else \
            f"{type(self).__name__} has seen no {kind} event in this run (no positive control)"

    def close(self) -> None:
        """Undo whatever the probe installed in the process."""


class CombinedProbe:
    """Several probes as one: for each kind, the first part that observes it answers.

    ``mark()`` returns an index into a table of the parts' own marks, so ``since`` works as
    the protocol says whichever part answers.
    """

    def __init__(self, parts: list[Any]) -> None:
        self.parts = [p for p in parts if p is not None]
        self.observes = frozenset().union(*(p.observes for p in self.parts))
        self._marks: list[tuple[int, ...]] = [tuple(0 for _ in self.parts)]
        self._held: dict[int, tuple[int, tuple[Any, Any]]] = {}  # part -> (events held, the last one's identity)
        self._rewrite: str | None = None

    def _part(self, kind: str) -> tuple[int, Any] | None:
        return next(((i, p) for i, p in enumerate(self.parts) if kind in p.observes), None)

    def events(self, kind: str | None = None, since: int = 0) -> list[Event]:
        """Events of ``kind`` from the part that observes it (every part's when ``kind`` is None)."""
        marks = self._marks[since]
        if kind is None:
            return [e for i, p in enumerate(self.parts) for e in p.events(None, marks[i])]
        found = self._part(kind)
        return [] if found is None else found[1].events(kind, marks[found[0]])

    def mark(self) -> int:
        """An index to pass as ``since``."""
        counts = tuple(p.mark() for p in self.parts)
        self._marks.append(counts)
        self._compare_held(counts)
        return len(self._marks) - 1

    def _compare_held(self, counts: tuple[int, ...]) -> None:
        """Each part's record must still hold, at the same place, the last event it held at the previous mark (a
        record only grows: the protocol's marks index it); keep the first part found to have dropped or moved one,
        then take the record's present end (``counts``: each part's mark) as the one to compare next."""
        for i, (part, count_now) in enumerate(zip(self.parts, counts, strict=True)):
            try:
                held = self._held.get(i)
                if held is not None and self._rewrite is None:
                    count, last = held
                    there = part.events(None, count - 1)[:1]
                    if [(e.get("kind"), e.get("comm")) for e in there] != [last]:
                        now = len(part.events(None, 0))
                        self._rewrite = (f"{type(part).__name__}'s record held {count} event(s) at a mark, the last "
                                         f"{last}; now it holds {now}, and at that place "
                                         f"{[(e.get('kind'), e.get('comm')) for e in there] or 'nothing'}")
                last_now = part.events(None, count_now - 1)[:1] if count_now else []
            except NotObservable:
                continue
            if last_now:
                self._held[i] = (count_now, (last_now[0].get("kind"), last_now[0].get("comm")))

    def record_rewritten(self) -> str | None:
        """Where a part's record lost or moved an event it held at an earlier mark (compared once more now), else
        None. The suite's marks index the record, so a record rewritten under them (events of a destroyed group
        dropped) shows later checks the wrong events: what it says cannot back a verdict."""
        self._compare_held(tuple(p.mark() for p in self.parts))
        return self._rewrite

    def protocol_breach(self) -> str | None:
        """Where a part's ``events()`` without ``since`` differs from ``events(since=0)``, ``events(kind)`` returns
        another kind, or an equal kind string built at run time (not the interned literal) gets other events than
        the literal, what differs, else None.

        The protocol's default is ``since=0`` (conformance.probe.Probe, docs/vendor-guide.md section 4); the
        suite itself always passes its marks, so only this comparison shows a vendor probe whose default
        differs (and whose callers, reading "every event", would get fewer). A faulted part answers for itself.
        """
        for part in self.parts:
            try:
                default, start = part.events(), part.events(None, 0)
                if default != start:
                    return (f"{type(part).__name__}.events() without since returned {len(default)} event(s), "
                            f"events(since=0) {len(start)}: the probe protocol's default is since=0")
                for kind in sorted(part.observes):
                    asked = part.events(kind, 0)
                    other = sorted({e.get("kind") for e in asked} - {kind})
                    if other:
                        return f"{type(part).__name__}.events({kind!r}) returned events of kind {other}"
                    built = kind[:1] + kind[1:]  # an equal kind string that is not the literal's object
                    by_value = part.events(built, 0) if built is not kind else asked
                    if by_value != asked:
                        return (f"{type(part).__name__}.events() with {kind!r} built at run time returned "
                                f"{len(by_value)} event(s), with the literal {len(asked)}: kinds "
                                "must be compared by value")
            except NotObservable:
                continue
        return None

    def control_missing(self, kind: str) -> str | None:
        """The answering part's positive control (parts without one are trusted to have seen it)."""
        found = self._part(kind)
        if found is None:
            return f"no part of the probe observes {kind} events"
        check = getattr(found[1], "control_missing", None)
        return check(kind) if check is not None else None

    def close(self) -> None:
        """Close every part that can be closed."""
        for part in self.parts:
            close = getattr(part, "close", None)
            if close is not None:
                close()


def combine(*parts: Any) -> CombinedProbe:
    """A CombinedProbe of ``parts`` (None entries are dropped); earlier parts win a kind."""
    return CombinedProbe(list(parts))
