"""LaunchProbe: one launch per front-end call, from the dispatcher (gloo) or a Python backend's class."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from conformance.probes.launches import LaunchProbe, op_name
from conformance.runner.isolation import ProcessState

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "toyccl"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


@pytest.fixture
def probe():
    state = ProcessState.capture()
    launches = LaunchProbe().start()
    yield launches
    launches.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    state.restore()


def _traffic(probe: LaunchProbe) -> tuple[list[dict], list[dict], list[dict]]:
    """Nothing, then one coalesced block of 3 all_reduce, then one plain all_reduce."""
    quiet = probe.mark()
    torch.ones(3).add_(1)  # a tensor op is no launch
    nothing = probe.events("launch", quiet)
    since = probe.mark()
    with dist._coalescing_manager():
        for _ in range(3):
            dist.all_reduce(torch.ones(2))
    block = probe.events("launch", since)
    since = probe.mark()
    dist.all_reduce(torch.ones(2))
    return nothing, block, probe.events("launch", since)


def test_gloo_launches_through_the_dispatcher(probe):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert probe.control_missing("launch") is not None  # no launch yet: no positive control
    nothing, block, single = _traffic(probe)
    assert nothing == []
    assert [(e["op"], e["ops"], e["coalesced"], e["source"]) for e in block] == [("allreduce", 3, True, "dispatcher")]
    assert [(e["op"], e["ops"], e["device"]) for e in single] == [("allreduce", 1, "cpu")]
    assert probe.control_missing("launch") is None


def test_python_backend_launches_through_its_class(probe):
    import toyccl
    from toyccl.backend import ToyProcessGroup

    if not dist.is_backend_available(toyccl.BACKEND_NAME):  # an earlier test restored the registry
        toyccl.register()
    original = ToyProcessGroup.allreduce
    dist.init_process_group("cpu:toyccl", store=dist.HashStore(), rank=0, world_size=1)
    probe.watch_class(type(dist.group.WORLD))
    nothing, block, single = _traffic(probe)
    assert nothing == []
    assert [(e["op"], e["ops"], e["coalesced"], e["source"]) for e in block] == [("allreduce", 3, True, "class")]
    assert [(e["op"], e["ops"], e["backend"]) for e in single] == [("allreduce", 1, toyccl.BACKEND_NAME)]
    probe.close()
    assert ToyProcessGroup.allreduce is original  # closing restores the class


@pytest.mark.parametrize(("dispatcher", "op"), [
    ("c10d.allreduce_coalesced_.default", "allreduce"), ("c10d.recv_any_source_.default", "recv"),
    ("c10d._allgather_base_.default", "allgather"), ("c10d.send.default", "send"),
])
def test_op_names(dispatcher, op):
    assert op_name(dispatcher) == op
