"""The suite reads a group's effective config as a snapshot: a target whose report is its live state fails."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from conformance.checks import common
from conformance.outcomes import CheckFailed

STATE = {"max_ctas": 16, "net_name": "Socket"}


class Part:
    """A config part over one group's state, handing it out as ``hand_out`` makes it."""

    def __init__(self, hand_out: Any) -> None:
        self.state = dict(STATE)
        self.hand_out = hand_out

    def effective(self, group: Any, probe: Any) -> Any:
        return self.hand_out(self.state)


@pytest.mark.parametrize("hand_out", [dict, MappingProxyType], ids=["copy", "read-only view"])
def test_a_snapshot_is_read_as_it_was(monkeypatch, hand_out) -> None:
    part = Part(hand_out)
    monkeypatch.setattr(common, "config_part", lambda ctx: part)
    assert common.effective_config(SimpleNamespace(rank=0, probe=None), "g", "a group") == STATE
    assert part.state == STATE


def test_live_state_fails_naming_both_reads(monkeypatch) -> None:
    part = Part(lambda state: state)
    monkeypatch.setattr(common, "config_part", lambda ctx: part)
    with pytest.raises(CheckFailed, match=r"rank 3: a group: the effective config changed .* first read "
                                          r"\{'max_ctas': 16, 'net_name': 'Socket'\}, read after the edit"):
        common.effective_config(SimpleNamespace(rank=3, probe=None), "g", "a group")
