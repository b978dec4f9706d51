"""A Megatron-like setup at world 8 (20 groups) on the simulator and on gloo: exact all_reduce results
on every group, and the simulator opens one store connection per rank for sequential collectives over
all 20 communicators. Before, each new communicator's stream thread opened its own connection while
the previous one idled (5-6 per rank here), and on this sandbox one connect in a few stalls for 5 s:
the first all_reduces over the groups took 5-15 s on the simulator against 0.1 s on gloo. Since each
communicator's boot records carry its members' mailboxes, its ops need no store at all: at most one."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from tests.clients.harness import run_ranks, values, wall
from tests.clients.megatron_like import build_and_reduce, group_count


def counting_connections(rank: int, n: int) -> dict[str, Any]:
    clones = []
    original = dist.TCPStore.clone

    def clone(self: dist.TCPStore) -> dist.TCPStore:
        clones.append(1)
        return original(self)

    dist.TCPStore.clone = clone
    try:
        # positive control: the counter sees a connection the test opens itself (then not counted below)
        root = dist.distributed_c10d._get_default_store()
        getattr(root, "_underlying_non_prefix_store", root).clone()
        control, clones[:] = len(clones), []
        first = build_and_reduce(rank, n)
        second = build_and_reduce(rank, n)
    finally:
        dist.TCPStore.clone = original
    return {"ok": {**first["ok"], **{f"again_{k}": v for k, v in second["ok"].items()}}, "connections": len(clones),
            "control": control}


def test_twenty_groups_at_world_8_exact_with_one_store_connection_per_rank() -> None:
    n = 8
    assert group_count(n) == 20
    sim_run = run_ranks("sim", n, counting_connections, deadline_s=120)
    gloo_run = run_ranks("gloo", n, build_and_reduce, deadline_s=120)
    sim, gloo = values(sim_run, n), values(gloo_run, n)
    print(f"20 groups at world 8, build + one all_reduce per group: sim {wall(sim_run):.2f}s "
          f"(twice over), gloo {wall(gloo_run):.2f}s")
    for rank, value in enumerate(sim):
        wrong = [k for k, ok in value["ok"].items() if not ok]
        assert not wrong, f"sim rank {rank}: wrong all_reduce results on {wrong}"
        assert value["control"] == 1, f"sim rank {rank}: the clone counter missed the test's own connection"
        assert value["connections"] <= 1, f"sim rank {rank} opened {value['connections']} store connections"
    assert all(all(v["ok"].values()) for v in gloo)
