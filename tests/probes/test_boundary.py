"""The probe boundary: a fault of a probe's own code is the suite's, reported not-observable, never raised."""

from __future__ import annotations

import pytest

from conformance.outcomes import NotObservable
from conformance.probes.base import ProbeFault, RecordingProbe
from conformance.probes.launches import LaunchProbe


class Broken:
    """A Python "backend" class whose name query raises, as a ProcessGroup subclass's getGroupName can."""

    group_name = "g"

    def getBackendName(self) -> str:
        raise RuntimeError("no name for you")

    def allreduce(self, tensors: list, opts: object = None) -> str:
        return "the backend's own result"


def test_a_fault_while_recording_a_launch_leaves_the_call_alone_and_makes_launches_not_observable():
    probe = LaunchProbe()
    probe.watch_class(Broken)
    try:
        assert Broken().allreduce([]) == "the backend's own result"  # not the probe's RuntimeError
    finally:
        probe.close()
    with pytest.raises(ProbeFault, match="LaunchProbe faulted during recording: RuntimeError: no name for you") as e:
        probe.events("launch")
    assert isinstance(e.value, NotObservable) and "not of the backend" in str(e.value)
    assert "no name for you" in probe.control_missing("launch")


def test_a_fault_in_a_lifecycle_hook_is_kept_for_every_kind_the_probe_observes():
    class Hooked(RecordingProbe):
        observes = frozenset({"launch", "comm_created"})

        def world_created(self, world: object) -> None:
            raise KeyError("world")

        def attach_store(self, store: object) -> object:
            raise OSError("store")

    probe = Hooked()
    probe.world_created(object())  # does not raise
    store = object()
    assert probe.attach_store(store) is store  # the store passes through untouched
    assert "during world_created: KeyError" in probe.faulted("launch")
    assert "during world_created: KeyError" in probe.faulted("comm_created")  # the first fault is kept
    with pytest.raises(ProbeFault):
        probe.events()


def test_a_probe_without_faults_answers_as_before():
    probe = LaunchProbe()
    assert probe.events("launch") == [] and probe.faulted("launch") is None
    assert "no launch event" in probe.control_missing("launch")
