"""The simulator over every kind of c10d store: an explicit FileStore, file:// init, a HashStore (one
process, so world size 1), TCPStore, and a PrefixStore over each. Before the control plane stopped
using store queues, FileStore, HashStore and file:// init failed with
"NotImplementedError: queue support is not implemented"."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.clients.harness import BACKENDS, run_ranks, values

TIMEOUT = datetime.timedelta(seconds=60)


def _store(kind: str, rank: int, n: int, port: int, tmpdir: str) -> dist.Store:
    base, _, prefixed = kind.partition("+")
    if base == "file":
        store: dist.Store = dist.FileStore(os.path.join(tmpdir, "store"), n)
    elif base == "hash":
        store = dist.HashStore()
    else:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    return dist.PrefixStore("app/", store) if prefixed else store


def store_init(kind: str):
    def init(backend: str, rank: int, n: int, port: int, tmpdir: str) -> None:
        if kind == "file://":
            dist.init_process_group(BACKENDS[backend], init_method=f"file://{tmpdir}/init", rank=rank,
                                    world_size=n, timeout=TIMEOUT)
        else:
            dist.init_process_group(BACKENDS[backend], store=_store(kind, rank, n, port, tmpdir), rank=rank,
                                    world_size=n, timeout=TIMEOUT)
    return init


def traffic(rank: int, n: int) -> dict[str, Any]:
    out = {}
    t = torch.full((3,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(t)
    out["all_reduce"] = torch.equal(t, torch.full((3,), float(n * (n + 1) // 2), dtype=torch.float64))
    b = torch.full((2,), rank, dtype=torch.int64)
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = torch.equal(b, torch.full((2,), n - 1))
    if n > 1:
        got = torch.zeros(4, dtype=torch.int32)
        ops = [dist.P2POp(dist.isend, torch.full((4,), rank, dtype=torch.int32), (rank + 1) % n),
               dist.P2POp(dist.irecv, got, (rank - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        out["ring"] = torch.equal(got, torch.full((4,), (rank - 1) % n, dtype=torch.int32))
    sub = dist.new_group(list(range(0, n, 2)))
    if rank % 2 == 0:
        s = torch.ones(1)
        dist.all_reduce(s, group=sub)
        out["subgroup"] = s.item() == len(range(0, n, 2))
    dist.barrier()
    return out


@pytest.mark.parametrize("kind", ["file", "file+prefix", "file://", "tcp+prefix"])
def test_sim_over_store(kind: str) -> None:
    n = 3
    sim = values(run_ranks("sim", n, traffic, init=store_init(kind)), n)
    gloo = values(run_ranks("gloo", n, traffic, init=store_init(kind)), n)
    assert sim == gloo
    assert all(all(v.values()) for v in sim), sim


@pytest.mark.parametrize("kind", ["hash", "hash+prefix"])
def test_sim_over_hash_store_world_of_one(kind: str) -> None:
    """A HashStore lives in one process: a world of one rank (the control plane still runs)."""
    sim = values(run_ranks("sim", 1, traffic, init=store_init(kind)), 1)
    assert sim == values(run_ranks("gloo", 1, traffic, init=store_init(kind)), 1)
    assert all(sim[0].values()), sim
