"""Options along generated split trees: a split given options gets them, a split given none gets its parent's.

The trees are SPLIT-TREES' (``split_trees.trees``). The world starts with one options set; at each level of a
tree every split is given a drawn options set or none. Each set differs from the others in cga_cluster_size,
max_ctas and min_ctas (so a child that took its grandparent's, the world's or the defaults shows which), and
every value lies inside NCCL's valid range. What each child must get is worked out from the tree alone.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from conformance.checks.common import Findings, effective_config, options_part
from conformance.checks.registry import CheckContext
from conformance.checks.split_trees import LEVELS, trees

# Index 0 is the world's. net_name "Socket" everywhere: NCCL fails init with a net plugin it cannot start.
OPTION_SETS: tuple[dict[str, Any], ...] = tuple(
    {"is_high_priority_stream": high, "cga_cluster_size": cga, "max_ctas": most, "min_ctas": least,
     "net_name": "Socket"}
    for high, cga, most, least in ((True, 4, 16, 2), (False, 2, 8, 1), (True, 1, 12, 3), (False, 8, 4, 4)))
INHERIT = None  # a level whose splits get no options


def level_options(tree: int, seed: int, levels: int) -> list[int | None]:
    """The options set (index into OPTION_SETS, never the world's) each level of tree ``tree`` passes, or INHERIT.
    Tree 0 gives, inherits, gives another; tree 1 inherits at every level (the world's all the way down); the
    others are drawn."""
    if tree == 0:
        return [1, INHERIT, 2][:levels]
    if tree == 1:
        return [INHERIT] * levels
    rng = random.Random(seed * 7919 + tree)
    return [rng.choice((INHERIT, 1, 2, 3)) for _ in range(levels)]


def check_option_trees(ctx: CheckContext) -> None:
    """Run every tree; each child's effective config must hold the fields of the set it should have."""
    ctx.init_world("eager", pg_options=options_part(ctx).make(**OPTION_SETS[0]))
    gen = ctx.generation
    findings = Findings(ctx)
    timeout = timedelta(seconds=ctx.timeout_s)
    for index, tree in enumerate(trees(ctx.world_size, gen.seed, gen.budget)):
        group, inherited = dist.group.WORLD, 0
        for level, (splits, given) in enumerate(zip(tree, level_options(index, gen.seed, len(tree)), strict=True)):
            split = next(s for s in splits if ctx.rank in s.group)
            passed = None if given is INHERIT else options_part(ctx).make(**OPTION_SETS[given])
            child = dist.split_group(parent_pg=group, split_ranks=[list(p) for p in split.parts], timeout=timeout,
                                     pg_options=passed)
            want = inherited if given is INHERIT else given
            how = "no options (the parent's)" if given is INHERIT else f"options set {given}"
            where = (f"seed {gen.seed} tree {index} level {level}: split of {list(split.group)} into "
                     f"{[list(p) for p in split.parts]} given {how}")
            findings.case(_expect_set, ctx, child, want, where)
            findings.checkpoint()
            group, inherited = child, want
    findings.conclude()


def set_mismatch(config: dict[str, Any], want: dict[str, Any]) -> str | None:
    """None when ``config`` holds every field of ``want``; else the fields that differ, and which of OPTION_SETS the
    config holds instead, where it holds one whole."""
    wrong = {k: config.get(k) for k, v in want.items() if config.get(k) != v}
    if not wrong:
        return None
    like = [i for i, s in enumerate(OPTION_SETS) if all(config.get(k) == v for k, v in s.items())]
    return f"{wrong} (the fields of set {like[0]})" if like else str(wrong)


def _expect_set(ctx: CheckContext, child: Any, want: int, where: str) -> None:
    """The child's effective config holds every field of OPTION_SETS[want]; names the set it holds instead."""
    config = effective_config(ctx, child, f"{where}: the child's effective config")
    if config is None:
        ctx.expect(False, f"{where}: the child's effective config", "a config", None)
        return
    seen = set_mismatch(config, OPTION_SETS[want])
    if seen is not None:
        ctx.expect(False, f"{where}: the child's effective options", f"set {want}: {OPTION_SETS[want]}", seen)


def dimensions() -> dict[str, tuple[str, ...]]:
    """The option trees' dimension and its values (``conformance coverage``)."""
    return {"options": ("a set given", "none given, under a set given above",
                        "none given, the world's at the deepest level")}


def coverage(count: int, seed: int) -> dict[str, set[str]]:
    """Which values the first ``count`` trees' options hit."""
    values = dimensions()["options"]
    hit: set[str] = set()
    for tree in range(count):
        chosen = level_options(tree, seed, LEVELS)
        for level, given in enumerate(chosen):
            if given is not INHERIT:
                hit.add(values[0])
            elif any(c is not INHERIT for c in chosen[:level]):
                hit.add(values[1])
            elif level == LEVELS - 1:
                hit.add(values[2])
    return {"options": hit}
