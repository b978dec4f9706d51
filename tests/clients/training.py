"""A tiny model, per-rank batches, and data-parallel steps next to a single-process reference: the training
loop the framework client tests (DDP, FSDP2) share."""

from __future__ import annotations

import torch


def model(seed: int = 0) -> torch.nn.Module:
    """A small float64 MLP whose parameters are fixed by ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()


def batch(rank: int, step: int) -> torch.Tensor:
    """Rank ``rank``'s input at ``step``, the same on every process."""
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank), dtype=torch.float64)


def train_with_reference(parallel: torch.nn.Module, reference: torch.nn.Module, rank: int, n: int,
                         steps: int) -> None:
    """``steps`` SGD steps of ``parallel`` on this rank's batch, and of ``reference`` on the mean loss over
    every rank's batch: what data parallelism must reproduce."""
    opt = torch.optim.SGD(parallel.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(steps):
        batches = [batch(r, step) for r in range(n)]
        parallel(batches[rank]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        (sum(reference(x).pow(2).mean() for x in batches) / n).backward()
        ref_opt.step()
        ref_opt.zero_grad()
