"""The example vendor backends, in 2 real processes: toyccl right, toyccl_flawed wrong."""

from __future__ import annotations

import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import multiprocess as mp
import pytest
import torch
import torch.distributed as dist

from conformance.outcomes import Skipped
from conformance.runner.isolation import ProcessState
from conformance.targets.base import WorldSpec
from conformance.targets.vendor import VendorTarget

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
for _pkg in ("toyccl", "toyccl_flawed"):
    if str(EXAMPLES / _pkg) not in sys.path:
        sys.path.insert(0, str(EXAMPLES / _pkg))

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, module: str, queue) -> None:
    try:
        target = VendorTarget(backend=module, module=module).driver()
        target.setup(rank, WORLD)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=20))
        target.init_world(store, rank, WORLD, WorldSpec(mode="lazy"), 20.0)
        single = torch.full((3,), float(rank + 1))
        dist.all_reduce(single)
        block = [torch.full((2,), float(rank + 1) * (i + 1)) for i in range(3)]
        with dist._coalescing_manager():
            for t in block:
                dist.all_reduce(t)
        gathered = torch.empty(2 * WORLD)
        dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
        scattered = torch.empty(1)
        dist.reduce_scatter_tensor(scattered, torch.arange(2.0) + rank)
        peer = torch.full((2,), float(rank))
        tagged = [torch.zeros(1), torch.zeros(1)]
        if rank == 0:
            dist.send(torch.tensor([7.0, 8.0]), 1)
            dist.send(torch.tensor([11.0]), 1, tag=11)
            dist.send(torch.tensor([22.0]), 1, tag=22)
        else:
            dist.recv(peer, 0)
            dist.recv(tagged[1], 0, tag=22)
            dist.recv(tagged[0], 0, tag=11)
        dist.barrier()
        queue.put((rank, [single.tolist(), [t.tolist() for t in block], gathered.tolist(),
                          scattered.tolist(), peer.tolist(), [t.item() for t in tagged]]))
        target.teardown()
    except BaseException as exc:
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
        raise


def _run(module: str) -> dict[int, list]:
    return _fork_world(_rank, module)


def _fork_world(rank_main: Any, *args: Any) -> dict[int, Any]:
    """What ``rank_main(rank, port, *args, queue)`` put on the queue, per rank, for WORLD forked ranks."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, *args, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    # The store lives here, created after forking, so that it outlives both ranks: hosted by rank 0, it went
    # away when rank 0 left the final barrier first, and rank 1, still reading the barrier's keys, saw
    # "Connection reset by peer".
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    results = dict(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    del server
    for rank, res in results.items():
        assert not isinstance(res, str), f"rank {rank}: {res}"
    return results


def test_toyccl_collectives_are_right():
    results = _run("toyccl")
    for rank, (single, block, gathered, scattered, peer, tagged) in results.items():
        assert single == [3.0] * 3
        assert block == [[3.0 * (i + 1)] * 2 for i in range(3)]
        assert gathered == [0.0, 0.0, 1.0, 1.0]
        assert scattered == [[1.0], [3.0]][rank]
        assert peer == ([0.0, 0.0] if rank == 0 else [7.0, 8.0])
        assert tagged == ([0.0, 0.0] if rank == 0 else [11.0, 22.0])  # tags select, whatever the order


def test_toyccl_flawed_ignores_tags():
    results = _run("toyccl_flawed")
    for rank, (single, block, _gathered, _scattered, peer, tagged) in results.items():
        assert single == [3.0] * 3 and block == [[3.0 * (i + 1)] * 2 for i in range(3)]  # collectives are fine
        assert peer == ([0.0, 0.0] if rank == 0 else [7.0, 8.0])  # untagged P2P is fine
        assert tagged == ([0.0, 0.0] if rank == 0 else [22.0, 11.0])  # tagged messages land in send order


@pytest.fixture
def restored():
    """Undo the backend registration importing a vendor module does in this process."""
    state = ProcessState.capture()
    yield
    state.restore()


def test_vendor_target_contract(restored):
    target = VendorTarget(backend="toyccl", module="toyccl")
    assert target.unavailable_reason() is None
    # nothing declared: what the probes see (launches, warnings; toyccl's own probe: comms, config events)
    # and the config part (toyccl's conformance_effective_config)
    assert target.capabilities == frozenset({"custom_backend", "observe:launch", "observe:warning",
                                             "observe:comm_created", "observe:config_applied", "observe:config"})
    assert target.declared == frozenset()
    assert target.parts.options is None and target.parts.config is not None
    assert target.default_backend == "cpu:toyccl"
    driver = target.driver()
    assert {"launch", "comm_created", "config_applied"} <= driver.probe().observes
    assert target.environment()["backend"] == "toyccl"
    driver.teardown()  # the probe's dispatch mode must not outlive the target
    with pytest.raises(Skipped, match="device_binding"):
        driver.init_world(None, 0, 1, WorldSpec(mode="eager"), 5.0)


def test_asking_for_capabilities_mid_check_keeps_the_record(restored):
    """Checks read target.capabilities after init: that must not restart the vendor's own record."""
    from toyccl.events import LOG

    target = VendorTarget(backend="toyccl", module="toyccl").driver()
    probe = target.probe()
    LOG.record("comm_created", comm="c0", members=[0], mode="lazy")
    assert "observe:comm_created" in target.capabilities
    assert [e["comm"] for e in probe.events("comm_created")] == ["c0"]
    target.teardown()


def test_declared_capabilities_are_parsed_and_checked(restored):
    target = VendorTarget(backend="toyccl", module="toyccl", capabilities="split, options,hints")
    assert target.declared == {"split", "options", "hints"}
    assert {"split", "options", "hints"} <= target.capabilities
    assert target.parts.options.make(max_ctas=4, hints={"netName": "IB"}).max_ctas == 4
    factory = VendorTarget(backend="toyccl", module="toyccl", capabilities=["options"],
                           options_factory="toyccl.options:ToyOptions")
    assert factory.parts.options.make(net_name="x").net_name == "x"
    with pytest.raises(ValueError, match="unknown capabilities \\['splitting'\\]"):
        VendorTarget(backend="toyccl", module="toyccl", capabilities="splitting")
    with pytest.raises(ValueError, match="observe:comm_created"):  # the probes decide those, not the vendor
        VendorTarget(backend="toyccl", module="toyccl", capabilities="observe:comm_created")


def test_a_skip_under_a_declared_capability_is_a_failure(restored):
    """Declaring split on cpu without device_binding: the split check cannot run, and that is a FAIL."""
    from conformance.runner.execute import run_check

    options = {"backend": "toyccl", "module": "toyccl"}
    declared = run_check(0, 1, dist.HashStore(), "SPLIT-MEMBERSHIP", "vendor", {**options, "capabilities": "split"},
                         timeout_s=5.0)
    assert declared["outcome"] == "fail", declared
    assert "declared capability split" in declared["detail"] and "device_binding" in declared["detail"]
    undeclared = run_check(0, 1, dist.HashStore(), "SPLIT-MEMBERSHIP", "vendor", options, timeout_s=5.0)
    assert undeclared["outcome"] == "skip", undeclared


def test_vendor_target_reregisters_after_a_check_undid_it(restored):
    target = VendorTarget(backend="toyccl", module="toyccl").driver()
    target.setup(0, 1)
    state_without = ProcessState.capture()
    dist.Backend._plugins.pop("TOYCCL")
    dist.Backend.backend_list.remove("toyccl")
    assert not dist.is_backend_available("toyccl")
    target.setup(0, 1)
    assert dist.is_backend_available("toyccl")
    target.teardown()  # the probe's dispatch mode must not outlive the test
    state_without.restore()


def test_vendor_target_reports_a_module_that_does_not_import():
    reason = VendorTarget(backend="nope", module="no_such_vendor_module").unavailable_reason()
    assert "no_such_vendor_module" in reason and "ModuleNotFoundError" in reason


def test_options_a_group_cannot_show_are_not_observable(restored):
    """A declared options part whose groups expose no options object: the copy check cannot look, not a failure."""
    from types import SimpleNamespace

    from conformance.outcomes import NotObservable

    part = VendorTarget(backend="toyccl", module="toyccl", capabilities="options").parts.options
    group = SimpleNamespace(bound_device_id=None, _get_backend=lambda device: object())
    with pytest.raises(NotObservable, match="exposes no options object"):
        part.fields(group)


def _forgetful_rank(rank: int, port: int, queue: Any) -> None:
    """A Python ProcessGroup backend whose creator never carries a binding over: under the suite's CPU binding
    shim the world is bound (torch 2.15 hands the creator the bound group, which 2.13 cannot), a new_group is not
    (torch uses the ProcessGroup the creator returned in place of the one it bound)."""
    try:
        from toyccl import ToyProcessGroup

        from simulator.shim import REFUSES_CPU_DEVICE_ID, python_backend_binding

        def create(common: Any, options: Any) -> ToyProcessGroup:
            return ToyProcessGroup(common.store, common.group_rank, common.group_size, common.timeout,
                                   list(common.global_ranks_in_group) or None, None, common.group_id)

        dist.Backend.register_backend("toyforget", create, extended_api=True, devices=["cpu"])
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=20))
        with python_backend_binding():
            dist.init_process_group("toyforget", store=store, rank=rank, world_size=WORLD,
                                    device_id=torch.device("cpu", 0) if REFUSES_CPU_DEVICE_ID else None)
            group = dist.new_group(list(range(WORLD)))
            queue.put((rank, [REFUSES_CPU_DEVICE_ID, str(dist.group.WORLD.bound_device_id),
                              str(group.bound_device_id)]))
            dist.destroy_process_group()
    except BaseException as exc:
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
        raise


def test_cpu_binding_shim_leaves_a_python_backends_subgroup_as_the_backend_made_it():
    for shimmed, world, group in _fork_world(_forgetful_rank).values():
        if shimmed:
            assert world == "cpu:0"  # the shim binds the world as torch 2.15 would hand the binding over
        assert group == "None"  # the backend dropped it, so SPLIT-BOUND-INHERIT can see that it did
