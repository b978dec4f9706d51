"""Example group builders for ``python -m conformance framework`` (what a framework's own
``initialize_model_parallel`` does: new_group on every rank for every group of a layout).

- ``megatron_like``: tensor, data, pipeline, model-parallel, tp x dp and embedding groups (20 at
  world 8 with tp=2, pp=2), no filters, no options: the shape Megatron-Core builds.
- ``with_options``: the same layout's tensor and data groups with device-qualified filters and
  per-group options (the path Megatron PR 5385 validated by hand: options become torchcomms hints).
- ``bare_filter``: a deliberately flawed builder whose filter is a bare backend name.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def layouts(n: int, tp: int = 2, pp: int = 2) -> dict[str, list[list[int]]]:
    """Rank groups by kind for world n = tp * pp * dp (rank = ((p * dp) + d) * tp + t)."""
    if n % (tp * pp):
        raise ValueError(f"world size {n} is not a multiple of tp * pp = {tp * pp}")
    dp = n // (tp * pp)
    grid = torch.arange(n).reshape(pp, dp, tp)
    return {
        "tp": [grid[p, d, :].tolist() for p in range(pp) for d in range(dp)],
        "dp": [grid[p, :, t].tolist() for p in range(pp) for t in range(tp)],
        "pp": [grid[:, d, t].tolist() for d in range(dp) for t in range(tp)],
        "mp": [grid[:, d, :].flatten().tolist() for d in range(dp)],
        "tp_dp": [grid[p].flatten().tolist() for p in range(pp)],
        "embd": [sorted({grid[0, d, t].item(), grid[-1, d, t].item()}) for d in range(dp) for t in range(tp)],
    }


def megatron_like(tp: int = 2, pp: int = 2) -> dict[str, list]:
    """Create every group of the layout on every rank; return this rank's groups by kind."""
    rank, mine = dist.get_rank(), {}
    for kind, groups in layouts(dist.get_world_size(), tp, pp).items():
        for ranks in groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine.setdefault(kind, []).append(group)
    return mine


def with_options(tp: int = 2, pp: int = 1, backend: str = "cpu:sim") -> None:
    """Tensor- and data-parallel groups with a backend filter and options of their own."""
    from simulator import SimOptions

    groups = layouts(dist.get_world_size(), tp, pp)
    for kind, options in (("tp", SimOptions(max_ctas=8, net_name="ib0")), ("dp", SimOptions(cga_cluster_size=2))):
        for ranks in groups[kind]:
            dist.new_group(ranks, backend=backend, pg_options=options)


def with_gloo_groups(tp: int = 2, pp: int = 1) -> None:
    """Simulator tensor-parallel groups and gloo data-parallel groups, as Megatron-Core makes gloo groups
    beside its NCCL ones (device-qualified here: ``cpu:gloo``)."""
    groups = layouts(dist.get_world_size(), tp, pp)
    for ranks in groups["tp"]:
        dist.new_group(ranks)
    for ranks in groups["dp"]:
        dist.new_group(ranks, backend="cpu:gloo")


def bare_filter(tp: int = 2, pp: int = 1) -> None:
    """Flawed: asks for the bare backend name, which torchcomms' device-qualified filters refuse to guess."""
    with_options(tp, pp, backend="sim")
