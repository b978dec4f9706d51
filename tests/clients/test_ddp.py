"""DistributedDataParallel on the simulator and on gloo: the same parameters as a float64 single-process
reference that trains on every rank's batch (DDP averages gradients), in four DDP configurations.

Before the Work futures carried the output tensors, every configuration crashed each rank with SIGSEGV
(the reducer reads element 0 of the future's value), and the stock allreduce_hook raised
"'NoneType' object is not subscriptable"."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from tests.clients.harness import run_ranks, values

CONFIGS = {
    "default": ({}, False),
    "tiny_buckets": ({"bucket_cap_mb": 1e-4}, False),
    "bucket_view_static_graph": ({"gradient_as_bucket_view": True, "static_graph": True}, False),
    "allreduce_hook": ({}, True),
}


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank), dtype=torch.float64)


def train(config: str, steps: int = 3):
    kwargs, hook = CONFIGS[config]

    def body(rank: int, n: int) -> dict[str, Any]:
        model = _model(seed=rank)  # DDP must broadcast rank 0's parameters
        reference = copy.deepcopy(_model(seed=0))
        ddp = DistributedDataParallel(model, **kwargs)
        if hook:
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        for step in range(steps):
            batches = [_batch(r, step) for r in range(n)]
            ddp(batches[rank]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            (sum(reference(x).pow(2).mean() for x in batches) / n).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters(), strict=True))
        return {"params": [p.detach() for p in model.parameters()], "diff_from_reference": diff}

    return body


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_ddp_matches_single_process_reference_on_sim_and_gloo(config: str) -> None:
    n = 2
    sim = values(run_ranks("sim", n, train(config)), n)
    gloo = values(run_ranks("gloo", n, train(config)), n)
    for name, got in (("sim", sim), ("gloo", gloo)):
        for rank, value in enumerate(got):
            assert value["diff_from_reference"] < 1e-12, \
                f"{name} rank {rank} {config}: parameters differ from the reference by {value['diff_from_reference']}"
    for rank in range(n):
        for p, q in zip(sim[rank]["params"], gloo[rank]["params"], strict=True):
            torch.testing.assert_close(torch.tensor(p[2], dtype=torch.float64), torch.tensor(q[2], dtype=torch.float64),
                                       rtol=1e-12, atol=1e-12)
