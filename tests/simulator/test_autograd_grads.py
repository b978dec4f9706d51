"""DDP with backward(create_graph=True) works on the simulator as on gloo (torch's test_ddp_create_graph).

The gradients DDP all-reduces then require grad themselves; the simulator's stream threads start with
grad mode on (it is per thread), so its in-place reductions into them were refused by autograd
("functions with out=... arguments don't support automatic differentiation").
"""

from __future__ import annotations

import torch
from torch import nn

from tests.clients.harness import run_ranks, values


class _Square(nn.Module):
    def __init__(self, start: float) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.tensor(start))

    def forward(self) -> torch.Tensor:
        return self.p.pow(2)


def create_graph_grads(rank: int, n: int) -> list[float]:
    """Each rank's parameter starts at 1.0; its grad per step is 2 * p, averaged over ranks by DDP."""
    ddp = nn.parallel.DistributedDataParallel(_Square(1.0))
    seen = []
    for _ in range(3):
        ddp().backward(create_graph=True)
        assert ddp.module.p.grad.requires_grad, f"rank {rank}: the grad should require grad under create_graph"
        seen.append(ddp.module.p.grad.item())
    return seen


def test_ddp_create_graph_all_reduces_grads_that_require_grad() -> None:
    got = values(run_ranks("sim", 2, create_graph_grads, deadline_s=60), 2)
    # grads accumulate (never zeroed): 2, 4, 6 on every rank, as each rank's grad is the same 2 * p = 2
    assert got == [[2.0, 4.0, 6.0]] * 2, f"expected grads [2, 4, 6] on both ranks, observed {got}"
