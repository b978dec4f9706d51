"""The collectives gloo implements on CPU, and the object collectives built on them, on the simulator
and on gloo: each rank checks its results against values it computes exactly from the known inputs,
and sim and gloo must agree. Before they were implemented, gather, scatter, all_to_all (list),
reduce_scatter (list), gather_object and scatter_object_list raised
"No backend type associated with device type cpu" on the simulator."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from packaging.version import Version

from tests.clients.harness import both, run_ranks, values

pytest.importorskip("numpy", reason="torch's object collectives convert through numpy")


def _v(rank: int, k: int = 4) -> torch.Tensor:
    return torch.arange(k, dtype=torch.float64) + 10 * rank


def collectives(rank: int, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    gathered = [torch.zeros(4, dtype=torch.float64) for _ in range(n)] if rank == 0 else None
    dist.gather(_v(rank), gathered, dst=0)
    out["gather"] = None if gathered is None else all(torch.equal(g, _v(j)) for j, g in enumerate(gathered))
    got = torch.zeros(3, dtype=torch.int64)
    dist.scatter(got, [torch.full((3,), 7 * j) for j in range(n)] if rank == n - 1 else None, src=n - 1)
    out["scatter"] = torch.equal(got, torch.full((3,), 7 * rank))
    ins = [torch.full((2,), 100 * rank + j, dtype=torch.int32) for j in range(n)]
    outs = [torch.zeros(2, dtype=torch.int32) for _ in range(n)]
    dist.all_to_all(outs, ins)
    out["all_to_all"] = all(torch.equal(o, torch.full((2,), 100 * j + rank, dtype=torch.int32))
                            for j, o in enumerate(outs))
    rs = torch.zeros(3, dtype=torch.float64)
    dist.reduce_scatter(rs, [torch.full((3,), float(rank * j + 1)).double() for j in range(n)])
    out["reduce_scatter"] = torch.equal(rs, torch.full((3,), float(sum(r * rank + 1 for r in range(n)))).double())
    lists = [[torch.zeros(2), torch.zeros(3)] for _ in range(n)]
    dist.all_gather_coalesced(lists, [torch.full((2,), float(rank)), torch.arange(3.0) * rank])
    out["all_gather_coalesced"] = all(torch.equal(a, torch.full((2,), float(j)))
                                      and torch.equal(b, torch.arange(3.0) * j) for j, (a, b) in enumerate(lists))
    objects = [None] * n if rank == 0 else None
    dist.gather_object({"rank": rank, "tag": "x" * rank}, objects, dst=0)
    out["gather_object"] = None if objects is None else objects == [{"rank": j, "tag": "x" * j} for j in range(n)]
    received: list[Any] = [None]
    dist.scatter_object_list(received, [("obj", j) for j in range(n)] if rank == 1 else None, src=1)
    out["scatter_object_list"] = received == [("obj", rank)]
    everyone: list[Any] = [None] * n
    dist.all_gather_object(everyone, {"r": rank})
    out["all_gather_object"] = everyone == [{"r": j} for j in range(n)]
    box = [f"from {rank}"]
    dist.broadcast_object_list(box, src=n - 1)
    out["broadcast_object_list"] = box == [f"from {n - 1}"]
    t = torch.full((2,), float(rank))
    fut = dist.all_reduce(t, async_op=True).get_future()
    value = fut.wait()
    out["future_value"] = (isinstance(value, list) and len(value) == 1 and value[0] is t
                           and torch.equal(t, torch.full((2,), float(sum(range(n))))))
    return out


@pytest.mark.parametrize("n", [3])
def test_collectives_exact_on_sim_and_gloo(n: int) -> None:
    sim, gloo = both(n, collectives)
    for name, got in (("sim", sim), ("gloo", gloo)):
        for rank, checks in enumerate(got):
            wrong = [k for k, ok in checks.items() if ok is False]
            assert not wrong, f"{name} rank {rank}: wrong results from {wrong}"
    assert sim == gloo


def uneven_all_to_all(rank: int, n: int) -> bool:
    ins = [torch.full((rank + j + 1,), 100 * rank + j) for j in range(n)]
    outs = [torch.zeros(j + rank + 1, dtype=torch.int64) for j in range(n)]
    dist.all_to_all(outs, ins)
    return all(torch.equal(o, torch.full((j + rank + 1,), 100 * j + rank)) for j, o in enumerate(outs))


def test_uneven_all_to_all_on_sim() -> None:
    """NCCL's all_to_all takes different sizes per pair (gloo refuses them); the simulator models NCCL."""
    assert values(run_ranks("sim", 3, uneven_all_to_all), 3) == [True] * 3


def monitored_barrier(rank: int, n: int) -> str:
    try:
        dist.monitored_barrier()
    except ValueError as exc:
        return str(exc)
    return "ok"


def test_monitored_barrier_is_refused_by_torch_front_end() -> None:
    """torch's front end refuses monitored_barrier before a backend runs: up to 2.13 on any backend but
    gloo; from 2.14 on a group without a registered CPU backend, which a Python group never has."""
    if Version(torch.__version__).release >= (2, 14):
        refusal = "monitored_barrier requires a group with a CPU-capable backend (e.g. GLOO)."
    else:
        refusal = "monitored_barrier is only implemented for GLOO backend."
    assert values(run_ranks("sim", 2, monitored_barrier), 2) == [refusal] * 2


def functional_and_dtensor(rank: int, n: int) -> dict[str, bool]:
    """Functional collectives (what DTensor and torch.compile'd code call: torch.ops._c10d_functional, which
    resolve the group by name and call its backend) and DTensor on a 1-D CPU mesh, each against exact values."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    world = dist.group.WORLD
    out: dict[str, bool] = {}
    t = torch.arange(4, dtype=torch.float64) + rank
    out["all_reduce"] = torch.equal(funcol.all_reduce(t, "sum", world),
                                    torch.arange(4, dtype=torch.float64) * n + sum(range(n)))
    out["all_gather_single"] = torch.equal(funcol.all_gather_tensor(t, 0, world),
                                           torch.cat([torch.arange(4, dtype=torch.float64) + j for j in range(n)]))
    rs = funcol.reduce_scatter_tensor(torch.arange(2.0 * n, dtype=torch.float64) * (rank + 1), "sum", 0, world)
    total = sum(j + 1 for j in range(n))
    mine = torch.arange(2.0 * rank, 2.0 * rank + 2, dtype=torch.float64)
    out["reduce_scatter_single"] = torch.equal(rs, mine * total)
    a2a = funcol.all_to_all_single(torch.arange(n, dtype=torch.int64) + 10 * rank, None, None, world)
    out["all_to_all_single"] = torch.equal(a2a, torch.tensor([10 * j + rank for j in range(n)]))
    mesh = init_device_mesh("cpu", (n,))
    whole = torch.arange(12.0 * n, dtype=torch.float64).reshape(n * 3, 4)
    sharded = distribute_tensor(whole, mesh, [Shard(0)])
    out["dtensor_shard_local"] = torch.equal(sharded.to_local(), whole[3 * rank:3 * rank + 3])
    out["dtensor_full_tensor"] = torch.equal(sharded.full_tensor(), whole)
    out["dtensor_redistribute"] = torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local(), whole)
    weight = torch.arange(8.0, dtype=torch.float64).reshape(4, 2)
    product = sharded @ distribute_tensor(weight, mesh, [Replicate()])
    out["dtensor_matmul"] = torch.equal(product.full_tensor(), whole @ weight)
    return out


def test_functional_collectives_and_dtensor_exact_on_sim_and_gloo() -> None:
    for name, got in zip(("sim", "gloo"), both(3, functional_and_dtensor), strict=True):
        for rank, checks in enumerate(got):
            wrong = [k for k, ok in checks.items() if not ok]
            assert not wrong, f"{name} rank {rank}: wrong results from {wrong}"
