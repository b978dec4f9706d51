"""The simulator's cpu:0 binding on the running torch: what real clients (Megatron's group setup) do.

A bound simulator world makes simulator subgroups (new_group, split_group in torch's own rank
order) and a gloo subgroup, and runs a coalesced batch_isend_irecv ring, all through torch's
front end. With the former ``meta:0`` binding the gloo subgroup failed ("No backend type
associated with device type meta"); on torch >= 2.14 every new_group failed assigning split_from.
"""

from __future__ import annotations

import datetime
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist

from conformance.torch_compat import since, split_child_ranks, split_nonmember_value
from tests.simulator.worlds import run_world

WORLD = 4


def _rank(rank: int, port: int, via_init: bool, out: Any) -> None:
    import simulator

    try:
        simulator.register()
        store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=datetime.timedelta(seconds=30))
        kwargs = {"device_id": torch.device("cpu", 0)} if via_init else {}
        dist.init_process_group("cpu:sim", store=store, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=20), **kwargs)
        if not via_init:
            simulator.bind_device(dist.group.WORLD)
        seen: dict[str, Any] = {"bound": str(dist.group.WORLD.bound_device_id)}
        sim_group = dist.new_group([1, 2])
        if rank in (1, 2):
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t, group=sim_group)
            seen["new_group"] = t.item()
        reverse = dist.new_group(list(range(WORLD))[::-1], sort_ranks=False)  # group rank i is rank WORLD-1-i
        gathered = torch.zeros(WORLD)
        dist.all_gather_into_tensor(gathered, torch.tensor([float(rank)]), group=reverse)
        seen["unsorted"] = (dist.get_rank(reverse), gathered.tolist())
        gloo = dist.new_group(list(range(WORLD)), backend="gloo")
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=gloo)
        seen["gloo"] = (t.item(), str(gloo.bound_device_id))
        child = dist.split_group(split_ranks=[[2, 0]])
        if rank in (0, 2):
            seen["split"] = (dist.get_process_group_ranks(child), dist.get_rank(child), str(child.bound_device_id))
        else:
            seen["split_nonmember"] = repr(child)
        send, recv = torch.full((2,), float(rank)), torch.zeros(2)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % WORLD), dist.P2POp(dist.irecv, recv, (rank - 1) % WORLD)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        seen["ring"] = recv.tolist()
        dist.barrier()
        dist.destroy_process_group()
        out.put((rank, seen))
    except Exception:
        out.put((rank, {"error": traceback.format_exc(limit=4)}))


def _world(via_init: bool) -> dict[int, dict[str, Any]]:
    return run_world(_rank, WORLD, via_init)


@pytest.mark.parametrize("via_init", [False, True], ids=["bind_device", "init_device_id"])
def test_bound_world_survives_real_client_group_setup(via_init: bool) -> None:
    seen = _world(via_init)
    errors = {r: s["error"] for r, s in seen.items() if "error" in s}
    assert not errors, f"ranks failed: {errors}"
    order = split_child_ranks([2, 0])
    for rank, s in seen.items():
        assert s["bound"] == "cpu:0", f"rank {rank}: world bound to {s['bound']}, expected cpu:0"
        assert s["gloo"] == (10.0, "cpu:0"), f"rank {rank}: gloo subgroup all_reduce/binding {s['gloo']}"
        assert s["ring"] == [float((rank - 1) % WORLD)] * 2, f"rank {rank}: ring received {s['ring']}"
        # the split communicator ranks members as torch's group does (ncclCommSplit's key), not by global rank
        assert s["unsorted"] == (WORLD - 1 - rank, [float(WORLD - 1 - i) for i in range(WORLD)]), \
            f"rank {rank}: new_group(reversed, sort_ranks=False): (group rank, all_gather) {s['unsorted']}"
        if rank in (1, 2):
            assert s["new_group"] == 5.0, f"rank {rank}: new_group([1, 2]) all_reduce gave {s['new_group']}"
        if rank in (0, 2):
            assert s["split"] == (order, order.index(rank), "cpu:0"), f"rank {rank}: split child {s['split']}"
        else:
            assert s["split_nonmember"] == repr(split_nonmember_value()), f"rank {rank}: {s['split_nonmember']}"
    if since("2.14"):
        assert order == [2, 0]
