"""A reusable check: groups derived from other groups keep their source's members.

Megatron-LM PR 3249 built an all-gather twin of each data-parallel group by recomputing
ranks with a hard-coded parallelism order. A framework points this check at its own
builder with ``CONFORMANCE_GROUP_BUILDER=package.module:function``; the function takes
``(source_groups, order, sizes, offset)`` -- the source groups as lists of global ranks,
the order string such as "tp-cp-ep-dp-pp", the size of each dimension and the first rank
of the layout -- and returns the derived groups, one per source group, in the same order.
"""

from __future__ import annotations

import importlib
import itertools
import os
from collections.abc import Callable

import torch.distributed as dist

from conformance.checks.common import expect_allreduce_members
from conformance.checks.registry import CheckContext

GROUP_BUILDER_ENV = "CONFORMANCE_GROUP_BUILDER"  # package.module:function of the builder under test

Builder = Callable[[list[list[int]], str, dict[str, int], int], list[list[int]]]
ORDERS = ("tp-cp-ep-dp-pp", "tp-dp-pp-cp-ep", "tp-pp-dp-cp-ep", "dp-tp-pp-cp-ep")


def rank_groups(order: str, sizes: dict[str, int], dim: str, offset: int = 0) -> list[list[int]]:
    """Groups along ``dim`` of a layout whose first-listed dimension varies fastest, from ``offset``."""
    dims = order.split("-")
    strides, stride = {}, 1
    for d in dims:
        strides[d] = stride
        stride *= sizes[d]
    others = [d for d in dims if d != dim]
    groups = []
    for coords in itertools.product(*(range(sizes[d]) for d in others)):
        base = offset + sum(c * strides[d] for c, d in zip(coords, others))
        groups.append(sorted(base + i * strides[dim] for i in range(sizes[dim])))
    return groups


def reference_builder(source: list[list[int]], order: str, sizes: dict[str, int], offset: int) -> list[list[int]]:
    """Derive each group from its source's own ranks (what a correct builder does)."""
    return [sorted(g) for g in source]


def load_builder() -> Builder:
    """The builder under test: CONFORMANCE_GROUP_BUILDER, or the reference builder."""
    path = os.environ.get(GROUP_BUILDER_ENV, "")
    if not path:
        return reference_builder
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def layouts(world_size: int) -> list[tuple[dict[str, int], int]]:
    """(sizes, offset) pairs that fit ``world_size``: the whole world, and a layout over the upper half
    (a non-zero first rank, as a second model or pipeline stage would have)."""
    half = world_size // 2
    full = {"tp": 2, "cp": 1, "ep": 1, "dp": max(1, world_size // 4) * (2 if world_size >= 4 else 1), "pp": 1}
    if world_size >= 8:
        full = {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": world_size // 4}
    upper = {"tp": 2 if half >= 4 else 1, "cp": 1, "ep": 1, "dp": 2, "pp": half // 4 if half >= 8 else 1}
    upper["dp"] = half // (upper["tp"] * upper["pp"])
    return [(full, 0), (upper, half)] if half >= 2 else [(full, 0)]


def check_derived_groups(ctx: CheckContext, builder: Builder | None = None) -> None:
    """For every order and layout, build source dp groups and derived twins; members must match."""
    build = builder or load_builder()
    for order in ORDERS:
        for sizes, offset in layouts(ctx.world_size):
            what = f"order {order}, sizes {sizes}, offset {offset}"
            source = rank_groups(order, sizes, "dp", offset)
            derived = build(source, order, sizes, offset)
            ctx.expect_equal(f"{what}: number of derived groups", len(source), len(derived))
            for src, twin in zip(source, derived):
                src_group = ctx.new_group(src)
                twin_group = ctx.new_group(sorted(twin))
                if ctx.rank in src:
                    ctx.expect(ctx.rank in twin, f"{what}: rank in its derived group", f"members {src}", sorted(twin))
                    ctx.expect_equal(f"{what}: derived group members", src, dist.get_process_group_ranks(twin_group))
                    expect_allreduce_members(ctx, twin_group, src, f"{what}: derived group")
                    expect_allreduce_members(ctx, src_group, src, f"{what}: source group")
