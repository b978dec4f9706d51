"""Each stack the simulator models, seen through torch's front end on an init without device_id: whether
the world is bound, what an eager new_group with a non-member does, and where P2P runs."""

from __future__ import annotations

import datetime
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.simulator.worlds import leave_together, run_world

WORLD = 3


def _rank(rank: int, port: int, stack: str, out: Any) -> None:
    import simulator

    try:
        simulator.register(stack=stack)
        simulator.LOG.clear()
        store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("cpu:sim", store=store, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=20))
        seen: dict[str, Any] = {"bound": str(dist.group.WORLD.bound_device_id)}
        if rank < 2:  # a 0 <-> 1 exchange on the world
            t = torch.full((2,), float(rank))
            (dist.send if rank == 0 else dist.recv)(t, 1 - rank)
            seen["recv"] = t.tolist()
        seen["p2p_comms"] = sorted(e["comm"] for e in simulator.LOG.events("comm_created") if e["mode"] == "p2p")
        seen["warnings"] = len(simulator.LOG.events("warning"))
        try:  # last: where the non-member fails, the members wait for it until the group's timeout
            dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
            seen["new_group"] = "ok"
        except Exception as exc:
            seen["new_group"] = f"{type(exc).__name__}: {exc}"
        leave_together(store, rank, WORLD)
        out.put((rank, seen))
    except Exception:
        out.put((rank, {"error": traceback.format_exc(limit=4)}))


# stack -> (bound without device_id, the non-member's new_group outcome, P2P pair communicators on rank 0)
EXPECTED = {
    "nccl-legacy": ("None", "ok", ["c0.p0x1"]),
    "nccl2": ("cpu:0", "AttributeError: 'ProcessGroupNCCL2' object has no attribute 'perform_nocolor_split'", []),
    "nccl-lazy": ("cpu:0", "AttributeError: 'ProcessGroupNCCLLazy' object has no attribute 'perform_nocolor_split'",
                  ["c0.p0x1"]),
    "torchcomms": ("cpu:0", "ok", []),
}


@pytest.mark.parametrize("stack", list(EXPECTED))
def test_stack_binding_nonmember_new_group_and_p2p(stack: str) -> None:
    seen = run_world(_rank, WORLD, stack)
    errors = {r: s["error"] for r, s in seen.items() if "error" in s}
    assert not errors, f"ranks failed: {errors}"
    bound, nonmember, pairs = EXPECTED[stack]
    assert all(s["bound"] == bound for s in seen.values()), {r: s["bound"] for r, s in seen.items()}
    assert seen[2]["new_group"] == nonmember, seen[2]["new_group"]
    for member in (0, 1):  # where the non-member could not take part, the members' split never completes
        got = seen[member]["new_group"]
        assert got == "ok" if nonmember == "ok" else "ranks [2] never arrived" in got, (member, got)
    assert seen[1]["recv"] == [0.0, 0.0], seen[1]
    assert seen[0]["p2p_comms"] == pairs, seen[0]["p2p_comms"]
    assert seen[0]["warnings"] == (1 if stack == "nccl-legacy" else 0), seen[0]  # only legacy's lazy P2P warns
