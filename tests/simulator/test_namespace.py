"""A world's namespace: every rank gets the same uid whoever arrives first, without waiting for rank 0, and
rank 0 deletes the claim once every member has read it, so a later world on the same store gets a new one."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from conformance.runner.isolation import ProcessState
from simulator.comm import UID_KEY, release_namespace, world_namespace


def _store() -> dist.Store:
    store = dist.PrefixStore("world/", dist.HashStore())
    store.set_timeout(datetime.timedelta(seconds=2))
    return store


def test_ranks_agree_on_the_namespace_whoever_arrives_first() -> None:
    store = _store()
    late_rank0 = [world_namespace(store, rank) for rank in (3, 1, 0, 2)]  # rank 0 is not first
    assert len(set(late_rank0)) == 1, late_rank0


def test_a_released_claim_gives_the_next_world_a_new_namespace() -> None:
    store = _store()
    first = world_namespace(store, 1)
    assert world_namespace(store, 0) == first
    release_namespace(store)
    assert not store.check([UID_KEY])
    second = world_namespace(store, 0)
    assert second != first and world_namespace(store, 1) == second


def test_rank0_releases_the_claim_once_the_world_communicator_is_booted(monkeypatch: pytest.MonkeyPatch) -> None:
    import simulator
    import simulator.backend

    stores = []

    def recording(store: dist.Store, rank: int) -> tuple[str, str]:
        stores.append(store)
        return world_namespace(store, rank)

    monkeypatch.setattr(simulator.backend, "world_namespace", recording)
    state = ProcessState.capture()  # torch's backend maps, as the runner keeps them
    simulator.register()
    try:
        dist.init_process_group("cpu:sim", store=_store(), rank=0, world_size=1)
        assert len(stores) == 1 and stores[0].check([UID_KEY]), "no uid claimed at init (positive control)"
        simulator.bind_device(dist.group.WORLD)  # eager: boots the world communicator
        assert not stores[0].check([UID_KEY]), "rank 0 kept the uid key after the world communicator's boot"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        simulator.unregister()
        state.restore()
