"""CombinedProbe.protocol_breach: a vendor probe whose events() default is not since=0, or whose kind filter lets
other kinds through, is named (the suite always passes its marks, so nothing else would show it); world_comm
fails on it (conformance/checks/common.py)."""

from __future__ import annotations

from typing import Any

import pytest
from toyccl.events import CommLog

from conformance.probes import combine


class SinceDefault(CommLog):
    """toyccl's log with another default for ``since`` (the mutants events.py:20 since=1 / since=-1)."""

    def __init__(self, default: int) -> None:
        super().__init__()
        self._default = default

    def events(self, kind: str | None = None, since: int | None = None) -> list[dict[str, Any]]:
        return super().events(kind, self._default if since is None else since)


class AnyKind(CommLog):
    """toyccl's log whose kind filter returns every kind but the one asked for (events.py:22 ``!=``)."""

    def events(self, kind: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self._events[since:] if kind is None or e["kind"] != kind]


def _recorded(log: CommLog) -> CommLog:
    log.record("comm_created", comm="toy:0", members=[0, 1], mode="eager")
    log.record("config_applied", comm="toy:0", config={})
    return log


def test_toyccl_log_keeps_the_protocol() -> None:
    assert combine(_recorded(CommLog())).protocol_breach() is None
    assert combine(CommLog()).protocol_breach() is None  # nothing recorded: nothing to compare


@pytest.mark.parametrize("default", [1, -1])
def test_a_default_since_other_than_zero_is_named(default: int) -> None:
    breach = combine(_recorded(SinceDefault(default))).protocol_breach()
    assert breach is not None and "default is since=0" in breach, breach


def test_a_kind_filter_that_lets_other_kinds_through_is_named() -> None:
    breach = combine(_recorded(AnyKind())).protocol_breach()
    assert breach is not None and "returned events of kind" in breach, breach


def test_world_comm_fails_on_a_breach() -> None:
    from types import SimpleNamespace

    from conformance.checks.common import world_comm
    from conformance.outcomes import CheckFailed

    ctx = SimpleNamespace(rank=0, world_size=2, probe=combine(_recorded(SinceDefault(1))),
                          target=SimpleNamespace(name="toyccl"))
    with pytest.raises(CheckFailed, match="breaks the probe protocol"):
        world_comm(ctx)
    ctx.probe = combine(_recorded(CommLog()))
    assert world_comm(ctx)["comm"] == "toy:0"


class ByIdentity(CommLog):
    """toyccl's log whose kind filter compares by identity (the mutant events.py:22 ``is``)."""

    def events(self, kind: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self._events[since:] if kind is None or e["kind"] is kind]


def test_a_kind_filter_by_identity_is_named() -> None:
    log = _recorded(ByIdentity())
    assert log.events("comm_created"), "the literal kind still finds its events (positive control)"
    assert log.events("".join(("comm_", "created"))) == []  # a kind built at run time finds none
    breach = combine(log).protocol_breach()
    assert breach is not None and "compared by value" in breach, breach


def test_a_record_that_only_grows_is_kept_and_one_that_drops_a_mark_s_events_is_named() -> None:
    """The record_rewritten rule (held-out 13/11: toyccl's shutdown() dropped a destroyed group's events, so a
    mark taken before the destroy pointed past the next group's creation)."""
    kept, rewritten = _recorded(CommLog()), _recorded(CommLog())
    for log in (kept, rewritten):
        probe = combine(log)
        probe.mark()
        log.record("launch", comm="toy:0", op="all_reduce")
        probe.mark()
        if log is rewritten:  # the destroyed communicator's events go; a new group's come after
            log._events[:] = [e for e in log._events if e["comm"] != "toy:0"]
        log.record("comm_created", comm="toy:1", members=[0], mode="split")
        log.record("launch", comm="toy:1", op="all_reduce")
        log.record("config_applied", comm="toy:1", config={})
        assert (probe.record_rewritten() is None) == (log is kept), probe.record_rewritten()
    found = combine(rewritten)
    found.mark()
    rewritten._events.pop(0)
    assert "held 3 event(s) at a mark" in (found.record_rewritten() or ""), found.record_rewritten()
