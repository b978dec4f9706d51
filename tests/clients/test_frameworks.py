"""FSDP2 (fully_shard), DTensor distribute/redistribute and a 2-D DeviceMesh on the simulator and on
gloo, each against a float64 reference every rank computes itself."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.clients import training
from tests.clients.harness import both


def fsdp2(rank: int, n: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    model, reference = training.model(), training.model()
    mesh = dist.device_mesh.init_device_mesh("cpu", (n,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    training.train_with_reference(model, reference, rank, n, steps=2)
    full = [p.full_tensor() for p in model.parameters()]
    diff = max((p - q).abs().max().item() for p, q in zip(full, reference.parameters(), strict=True))
    return {"params": full, "diff": diff}


def dtensor(rank: int, n: int) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (n,))
    full = torch.arange(4 * n * 3, dtype=torch.float64).reshape(4 * n, 3)
    sharded = distribute_tensor(full, mesh, [Shard(0)])  # scatters from rank 0
    local_ok = torch.equal(sharded.to_local(), full[4 * rank:4 * (rank + 1)])
    by_col = sharded.redistribute(mesh, [Shard(1)]) if 3 % n == 0 else sharded
    replicated = sharded.redistribute(mesh, [Replicate()])
    total = (sharded * 2).sum().full_tensor()
    return {"local": local_ok, "replicate": torch.equal(replicated.to_local(), full),
            "col": torch.equal(by_col.full_tensor(), full), "sum": total.item() == 2 * full.sum().item()}


def mesh_2d(rank: int, n: int) -> dict[str, Any]:
    mesh = dist.device_mesh.init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
    t = torch.full((3,), float(rank), dtype=torch.float64)
    dp, tp = t.clone(), t.clone()
    dist.all_reduce(dp, group=mesh.get_group("dp"))
    dist.all_reduce(tp, group=mesh.get_group("tp"))
    grid = torch.arange(n).reshape(2, n // 2)
    row, col = divmod(rank, n // 2)
    return {"dp": torch.equal(dp, torch.full((3,), float(grid[:, col].sum()), dtype=torch.float64)),
            "tp": torch.equal(tp, torch.full((3,), float(grid[row].sum()), dtype=torch.float64)),
            "dp_ranks": dist.get_process_group_ranks(mesh.get_group("dp")),
            "tp_ranks": dist.get_process_group_ranks(mesh.get_group("tp"))}


def test_fsdp2_matches_reference_on_sim_and_gloo() -> None:
    sim, gloo = both(2, fsdp2)
    for name, got in (("sim", sim), ("gloo", gloo)):
        diffs = [v["diff"] for v in got]
        assert all(d < 1e-12 for d in diffs), f"{name}: FSDP2 parameters differ from the reference by {diffs}"
    sim_params, gloo_params = _flat([v["params"] for v in sim]), _flat([v["params"] for v in gloo])
    assert len(sim_params) == len(gloo_params) > 0
    assert max(abs(a - b) for a, b in zip(sim_params, gloo_params, strict=True)) < 1e-12


def _flat(x: Any) -> list[float]:
    if isinstance(x, list | tuple):
        return [v for item in x for v in _flat(item)]
    return [x] if isinstance(x, float) else []


def test_dtensor_distribute_and_redistribute_on_sim_and_gloo() -> None:
    sim, gloo = both(3, dtensor)
    assert sim == gloo
    assert all(all(v.values()) for v in sim), sim


def test_device_mesh_2d_on_sim_and_gloo() -> None:
    sim, gloo = both(4, mesh_2d)
    assert sim == gloo
    assert all(v["dp"] and v["tp"] for v in sim), sim
