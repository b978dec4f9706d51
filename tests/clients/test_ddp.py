"""DistributedDataParallel on the simulator and on gloo: the same parameters as a float64 single-process
reference that trains on every rank's batch (DDP averages gradients), in four DDP configurations.

Before the Work futures carried the output tensors, every configuration crashed each rank with SIGSEGV
(the reducer reads element 0 of the future's value), and the stock allreduce_hook raised
"'NoneType' object is not subscriptable"."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from tests.clients import training
from tests.clients.harness import run_ranks, values

CONFIGS = {
    "default": ({}, False),
    "tiny_buckets": ({"bucket_cap_mb": 1e-4}, False),
    "bucket_view_static_graph": ({"gradient_as_bucket_view": True, "static_graph": True}, False),
    "allreduce_hook": ({}, True),
}


def train(config: str, steps: int = 3):
    kwargs, hook = CONFIGS[config]

    def body(rank: int, n: int) -> dict[str, Any]:
        local = training.model(seed=rank)  # DDP must broadcast rank 0's parameters
        reference = training.model(seed=0)
        ddp = DistributedDataParallel(local, **kwargs)
        if hook:
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        training.train_with_reference(ddp, reference, rank, n, steps)
        diff = max((p - q).abs().max().item() for p, q in zip(local.parameters(), reference.parameters(), strict=True))
        return {"params": [p.detach() for p in local.parameters()], "diff_from_reference": diff}

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
