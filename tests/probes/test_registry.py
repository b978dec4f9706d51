"""A new probe is one file plus one line in conformance.probes.PROBES; a target that lists it observes its kinds."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from conformance.probes import PROBES, RecordingProbe, probe_class
from conformance.runner.isolation import ProcessState
from conformance.targets.base import Driver, Target, WorldSpec


class TeardownProbe(RecordingProbe):
    """Stands for a new probe's file: records comm_destroyed when the world it saw created is destroyed."""

    observes = frozenset({"comm_destroyed"})
    calls: list[str] = []

    def start(self) -> TeardownProbe:
        self.calls.append("start")
        return self

    def attach_store(self, store: dist.Store) -> dist.Store:
        self.calls.append("attach_store")
        return store

    def world_created(self, world: dist.ProcessGroup) -> None:
        self.calls.append(f"world_created:{world.size()}")

    def close(self) -> None:
        self.calls.append("close")


class _Lazy(Driver):
    def init_world(self, store, rank, world_size, spec, timeout_s):
        return self._init_default_group(store, rank, world_size, spec, timeout_s)


class _Target(Target):
    name = "probe-test"
    probes = ("launches", "teardown-test")
    default_backend = "cpu:gloo"

    def unavailable_reason(self, world_size: int = 1) -> str | None:
        return None

    def driver(self) -> _Lazy:
        return _Lazy(self)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(PROBES, "teardown-test", f"{__name__}:TeardownProbe")  # the one registration line
    TeardownProbe.calls.clear()
    state = ProcessState.capture()
    yield
    state.restore()


def test_unregistered_probe_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown probe 'teardown-test'.*launches"):
        probe_class("teardown-test")


def test_registered_probe_gives_its_capability_and_is_driven_through_a_check(registered):
    target = _Target()
    assert {"observe:comm_destroyed", "observe:launch", "observe:warning"} <= target.capabilities
    assert "observe:comm_created" not in target.capabilities  # no probe listed observes it
    driver = target.driver()
    driver.setup(0, 1)
    assert driver.probe().observes >= {"comm_destroyed", "launch"}
    driver.init_world(dist.HashStore(), 0, 1, WorldSpec(mode="lazy"), 10.0)
    dist.all_reduce(torch.ones(1))
    assert [e["op"] for e in driver.probe().events("launch")] == ["allreduce"]  # the listed launches probe too
    driver.teardown()
    assert TeardownProbe.calls == ["start", "attach_store", "world_created:1", "close"]
    assert not dist.is_initialized()
