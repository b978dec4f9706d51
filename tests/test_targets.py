"""The target interface: parent-side descriptions, parts whose presence is the capability, cleanup after a kill."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist
from torch.utils._python_dispatch import _get_current_dispatch_mode

from conformance.probe import EVENT_KINDS, observing
from conformance.runner import PoolSet
from conformance.runner.orchestrate import run_case
from conformance.runner.worker import SCRATCH_ENV
from conformance.spec import load_catalog
from conformance.targets import CAPABILITIES, available_targets, make_target
from conformance.targets.base import FEATURES
from simulator import shm
from simulator.comm import SHM_PREFIX_ENV

pytest.importorskip("toyccl", reason="examples/toyccl is not installed (pip install ./examples/toyccl)")


@pytest.mark.parametrize("name", available_targets())
def test_a_description_derives_its_capabilities_from_its_parts_and_probe(name: str) -> None:
    target = make_target(name)
    caps = target.capabilities
    assert caps <= set(CAPABILITIES), caps - set(CAPABILITIES)
    assert target.features <= FEATURES
    assert ("options" in caps) == (target.parts.options is not None)
    assert ("observe:config" in caps) == (target.parts.config is not None)
    assert {c for c in caps if c.startswith("observe:") and c != "observe:config"} == \
        {observing(k) for k in target.observes}
    assert target.observes <= set(EVENT_KINDS)


@pytest.mark.parametrize("name", ["sim", "gloo", "toyccl"])
def test_reading_a_description_leaves_the_process_alone(name: str) -> None:
    """The parent reads descriptions: no world, no probe (a dispatch mode), no simulator registration."""
    mode = _get_current_dispatch_mode()
    target = make_target(name)
    assert target.unavailable_reason(2) is None
    _ = (target.capabilities, target.declared, target.stack, target.environment(), target.gpu)
    assert _get_current_dispatch_mode() is mode  # no launch probe started
    assert not dist.is_initialized()
    assert name != "sim" or not dist.is_backend_available("sim")


def test_every_spec_capability_is_one_a_target_can_have() -> None:
    for req in load_catalog():
        assert set(req.capabilities) <= set(CAPABILITIES), (req.id, req.capabilities)


def test_the_sim_driver_names_its_segments_with_the_runners_scratch(monkeypatch) -> None:
    monkeypatch.setenv(SCRATCH_ENV, "cfmtest_")
    monkeypatch.delenv(SHM_PREFIX_ENV, raising=False)
    driver = make_target("sim").driver()
    driver.setup(0, 1)
    try:
        assert os.environ[SHM_PREFIX_ENV] == "cfmtest_"
    finally:
        driver.teardown()


def test_the_pool_runs_the_targets_cleanup_after_a_kill() -> None:
    """run_case hands the target's cleanup to the pool; the sim target's removes the segments named with the
    pool's scratch prefix (what a killed rank leaves in /dev/shm)."""
    pools = PoolSet()
    try:
        req = next(r for r in load_catalog() if r.id == "COLL-ROOTED")
        assert run_case(pools, req, "sim", 2, timeout_s=30.0).outcome == "pass"
        pool = pools.get(2)
        left = shm.path(f"{pool.scratch}c0.r0.{os.getpid()}x1")
        with open(left, "wb") as f:
            f.write(b"x")
        pool._kill()
        assert not os.path.exists(left)
    finally:
        pools.close()
