"""StoreProbe: sees gloo's mesh bootstrap for the world and each new group, and nothing for ops."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from conformance.probes.store import RecordingStore, StoreProbe
from conformance.runner.isolation import ProcessState


@pytest.fixture
def clean():
    state = ProcessState.capture()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    state.restore()


def test_sees_world_and_new_group_not_ops(clean):
    probe = StoreProbe()
    assert probe.events("comm_created") == []
    assert probe.control_missing("comm_created") is not None  # nothing seen yet: no positive control
    store = RecordingStore(dist.HashStore(), probe)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    world = probe.events("comm_created")
    assert [(e["members"], e["mode"], e["device"]) for e in world] == [([0], "lazy", "cpu")]
    assert probe.control_missing("comm_created") is None
    since = probe.mark()
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.barrier()
    assert probe.events("comm_created", since) == []  # ops make no communicator, and none is invented
    group = dist.new_group([0])
    made = probe.events("comm_created", since)
    assert len(made) == 1 and made[0]["group"] == group.group_name and made[0]["members"] == [0]


def test_ignores_keys_that_are_not_mesh_addresses():
    probe = StoreProbe()
    store = RecordingStore(dist.HashStore(), probe)
    store.set("world1/done/0", b"1")
    store.set("0/cpu/0", b"x")
    assert probe.events() == []


def test_control_missing_helper_covers_probes_without_controls():
    from conformance.probe import NullProbe, control_missing
    from conformance.probes import combine

    assert "does not observe comm_created" in control_missing(NullProbe(), "comm_created")
    probe = StoreProbe()
    assert control_missing(combine(probe), "comm_created") is not None  # nothing seen yet
    probe.record("comm_created", comm="0", members=[0])
    assert control_missing(combine(probe), "comm_created") is None
