"""A Megatron-like group setup: tensor, pipeline, data, context and model-parallel groups at world 8
(new_group for every group on every rank, as initialize_model_parallel does), then one all_reduce on
each group a rank belongs to, checked against the exact sum of the members' ranks."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist

from conformance.framework_builders import layouts


def build_and_reduce(rank: int, n: int) -> dict[str, Any]:
    made = []
    for kind, ranks_list in layouts(n).items():
        for i, ranks in enumerate(ranks_list):
            group = dist.new_group(ranks)
            if rank in ranks:
                made.append((f"{kind}{i}", ranks, group))
    ok = {}
    for name, ranks, group in made:
        t = torch.full((1024,), float(rank), dtype=torch.float64)
        dist.all_reduce(t, group=group)
        ok[name] = torch.equal(t, torch.full((1024,), float(sum(ranks)), dtype=torch.float64))
    return {"groups": sum(len(v) for v in layouts(n).values()), "ok": ok}


def group_count(n: int) -> int:
    """How many groups the setup creates."""
    return sum(1 for _ in itertools.chain.from_iterable(layouts(n).values()))
