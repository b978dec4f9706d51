"""Example group builders for ``python -m conformance framework`` (what a framework's own
``initialize_model_parallel`` does: new_group on every rank for every group of a layout).

- ``megatron_like``: tensor, data, pipeline, model-parallel, tp x dp and embedding groups (20 at
  world 8 with tp=2, pp=2), no filters, no options: the shape Megatron-Core builds.
- ``with_options``: the same layout's tensor and data groups with device-qualified filters and
  per-group options (the path Megatron PR 5385 validated by hand: options become torchcomms hints).
- ``bare_filter``: a deliberately flawed builder whose filter is a bare backend name.
- ``pr5385``: Megatron-LM PR 5385's layout ("route collectives through nccl2"): every covering
  subgroup made with one ``split_group`` call over the bound world, a device-qualified filter and
  options per kind; pipeline groups made members-only with ``new_group`` on the lazy backend.
"""

from __future__ import annotations

from collections.abc import Callable

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


def partitions(n: int, tp: int = 2, pp: int = 2, cp: int = 1) -> dict[str, list[list[int]]]:
    """Megatron-Core's covering rank partitions by kind, in its default order tp-cp-dp-pp
    (rank = ((p * dp + d) * cp + c) * tp + t), with its default embedding ranks (first and last
    pipeline stage) and position-embedding ranks (first stage)."""
    if n % (tp * pp * cp):
        raise ValueError(f"world size {n} is not a multiple of tp * pp * cp = {tp * pp * cp}")
    dp = n // (tp * pp * cp)
    g = torch.arange(n).reshape(pp, dp, cp, tp)
    every = [(p, d, c, t) for p in range(pp) for d in range(dp) for c in range(cp) for t in range(tp)]

    def kind(index: Callable[[int, int, int, int], torch.Tensor]) -> list[list[int]]:
        return [list(r) for r in dict.fromkeys(tuple(index(*i).flatten().tolist()) for i in every)]

    pipelines = kind(lambda p, d, c, t: g[:, d, c, t])
    return {
        "dp_cp": kind(lambda p, d, c, t: g[p, :, :, t]), "dp": kind(lambda p, d, c, t: g[p, :, c, t]),
        "cp": kind(lambda p, d, c, t: g[p, d, :, t]), "mp": kind(lambda p, d, c, t: g[:, d, c, :]),
        "tp": kind(lambda p, d, c, t: g[p, d, c, :]), "pp": pipelines,
        "embd": [sorted({r[0], r[-1]}) for r in pipelines], "pos_embd": [[r[0]] for r in pipelines],
        "tp_dp_cp": kind(lambda p, d, c, t: g[p]), "tp_dp": kind(lambda p, d, c, t: g[p, :, c, :]),
        "tp_cp": kind(lambda p, d, c, t: g[p, d, :, :]),
    }


def _device_filter() -> str:
    """The world's device leg as a filter, as PR 5385's ``_split_group_backend`` picks ``cuda:<backend>`` out of
    ``get_backend_config()``: the leg that is not gloo (on the simulator ``cpu:sim``, its only leg)."""
    legs = [leg.strip() for leg in dist.get_backend_config().split(",")]
    return next(leg for leg in legs if leg.partition(":")[2].strip() != "gloo")


def pr5385(tp: int = 2, pp: int = 2, cp: int = 1, pipeline_backend: str | None = "cpu:sim-lazy",
           options: bool = True) -> None:
    """Megatron-LM PR 5385's group setup, on the world ``framework`` makes (bound, eager).

    Each covering kind is one ``split_group`` call with the world's device leg as its filter; the pipeline
    groups are ``new_group(backend=pipeline_backend, use_local_synchronization=True, device_id=<bound>)``
    called by every rank for every pipeline group (non-members return at once), the simulator's
    ``sim-lazy`` standing for ``nccl-lazy``. With ``options``, each kind gets options of its own
    (``is_high_priority_stream`` on the data-parallel kinds, ``net_name`` and CTA bounds elsewhere),
    which must reach each communicator (as hints on the torchcomms stack). Left out here: the PR's gloo
    partition groups (a split with filter ``cpu:gloo,cuda:nccl2`` needs a gloo leg on the world; the
    simulator's world has one device type, cpu, which its own leg serves) and the expert groups (with
    expert parallelism 1 they repeat the partitions above). ``pipeline_backend=None`` makes the pipeline groups
    with one ``split_group`` call too (the fix where a stack refuses members-only groups).
    """
    from simulator import SimOptions

    def opts(kind: str) -> SimOptions | None:
        if not options:
            return None
        if kind.startswith("dp"):
            return SimOptions(is_high_priority_stream=True, net_name="ib")
        return SimOptions(max_ctas=8 + len(kind), min_ctas=1, net_name="socket")

    device = _device_filter()
    bound = dist.group.WORLD.bound_device_id
    for kind, groups in partitions(dist.get_world_size(), tp, pp, cp).items():
        if kind == "pp" and pipeline_backend is not None:
            for ranks in groups:
                dist.new_group(ranks, backend=pipeline_backend, pg_options=opts(kind), use_local_synchronization=True,
                               device_id=bound, group_desc="PIPELINE_MODEL_PARALLEL_GROUP")
            continue
        dist.split_group(split_ranks=groups, pg_options=opts(kind), group_desc=kind.upper(), backend=device)
