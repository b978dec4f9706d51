"""Generated split trees: a split at any depth makes one communicator of exactly its group's global ranks.

A tree is a list of levels; each level partitions every group of the level above (the world at first) into
parts given as ranks *of that group*, in a drawn order, so that from the second level on a part's group ranks
differ from its global ranks. Every rank calls exactly one split per level (every part holds every rank of its
group once), so each rank registers as many groups as the others: torch 2.13 salts a split's hashed name with
that count (v2.13.0 distributed_c10d.py:5464-5468), and a tree that left ranks out would make members of a
later split name their group differently.

At each level every rank judges what its probe recorded during its split, the child's all_reduce and a P2P
ring in the child: one split communicator whose members are the child's global ranks and whose parent is the
parent group's communicator; pair communicators of the rank and a ring neighbour; every communicator holding
the rank. Data is exact: values each rank computes from the tree, the level, the sender and the element.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.common import Findings, new_comms, world_comm
from conformance.checks.reference import mismatch
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed
from conformance.torch_compat import split_child_ranks

LEVELS = 3
ELEMENTS = 3
TREES_AT_BUDGET_0 = 3  # the two boundary trees and one drawn; one more drawn per budget unit


@dataclass(frozen=True)
class Split:
    """One group's split at one level: the group's global ranks in group-rank order, and its parts (group
    ranks, in the order passed to split_group)."""

    group: tuple[int, ...]
    parts: tuple[tuple[int, ...], ...]

    def children(self) -> list[tuple[int, ...]]:
        """Each part's child as global ranks, in torch's group-rank order for the running version."""
        return [tuple(self.group[r] for r in split_child_ranks(list(p))) for p in self.parts]

    def child(self, rank: int) -> tuple[int, ...]:
        """Global ranks of ``rank``'s child."""
        return next(c for c in self.children() if rank in c)


Tree = list[list[Split]]  # levels of splits; every rank is in one group of each level


def _grow(world_size: int, cut: Callable[[int, int], list[list[int]]]) -> Tree:
    """LEVELS levels from the world down: ``cut(level, size)`` gives the parts (group ranks) of a group."""
    groups: list[tuple[int, ...]] = [tuple(range(world_size))]
    tree: Tree = []
    for level in range(LEVELS):
        splits = [Split(g, tuple(tuple(p) for p in cut(level, len(g)) if p)) for g in groups]
        tree.append(splits)
        groups = [c for s in splits for c in s.children()]
    return tree


def _apart_cut(level: int, size: int) -> list[list[int]]:
    """Rank 0 apart from the ranks above it, then each group whole in reverse order, then every rank alone."""
    if level == 0:
        return [list(range(1, size)), [0]]
    if level == 1:
        return [list(reversed(range(size)))]
    return [[r] for r in range(size)]


def _rotated_cut(level: int, size: int) -> list[list[int]]:
    """The world whole with its ranks rotated by one, then even and odd group ranks (a group of two whole, in
    order), then each group whole."""
    if level == 0:
        return [[*range(1, size), 0]]
    if level == 1:
        return [list(range(0, size, 2)), list(range(1, size, 2))] if size > 2 else [list(range(size))]
    return [list(range(size))]


def _drawn_cut(rng: random.Random) -> Callable[[int, int], list[list[int]]]:
    """Each group cut into 1 to ``size`` parts of its ranks in a drawn order."""
    def cut(level: int, size: int) -> list[list[int]]:
        order = list(range(size))
        rng.shuffle(order)
        ends = sorted(rng.sample(range(1, size), rng.randint(0, size - 1)))
        return [order[a:b] for a, b in zip([0, *ends], [*ends, size])]
    return cut


BOUNDARY_CUTS = (_apart_cut, _rotated_cut)


def trees(world_size: int, seed: int, budget: int) -> list[Tree]:
    """The boundary trees, then drawn ones (every rank gets the same list)."""
    drawn = TREES_AT_BUDGET_0 - len(BOUNDARY_CUTS) + max(0, budget)
    return [_grow(world_size, cut) for cut in BOUNDARY_CUTS] + [
        _grow(world_size, _drawn_cut(random.Random(seed * 1009 + i))) for i in range(drawn)]


def value(tree: int, level: int, sender: int) -> torch.Tensor:
    """The int64 elements ``sender`` contributes at (tree, level): distinct per sender, tree, level, element."""
    base = ((tree * 8 + level) * 4096 + sender) * 16
    return torch.arange(base, base + ELEMENTS, dtype=torch.int64)


def check_split_trees(ctx: CheckContext) -> None:
    """Run every tree on a bound world; fail naming the seed, tree, level and what the probe or data showed."""
    ctx.init_world("eager")
    world = world_comm(ctx)
    gen = ctx.generation
    findings = Findings(ctx)
    timeout = timedelta(seconds=ctx.timeout_s)  # torch's default is the backend's (30 min or more)
    for index, tree in enumerate(trees(ctx.world_size, gen.seed, gen.budget)):
        group, comm = dist.group.WORLD, world["comm"]
        for level, splits in enumerate(tree):
            split = next(s for s in splits if ctx.rank in s.group)
            where = f"seed {gen.seed} tree {index} level {level}: split of {list(split.group)} into " \
                    f"{[list(p) for p in split.parts]} (group ranks)"
            since = ctx.probe.mark()
            child = dist.split_group(parent_pg=group, split_ranks=[list(p) for p in split.parts], timeout=timeout)
            members = split.child(ctx.rank)
            findings.case(_judge_data, ctx, child, members, index, level, where)
            findings.checkpoint()
            if child is None or child is dist.GroupMember.NON_GROUP_MEMBER:
                findings.conclude()  # no group to go deeper in (the failure is recorded)
            made = _audit(ctx, findings, since, members, comm, where)
            group, comm = child, made
    findings.conclude()


def _judge_data(ctx: CheckContext, child: Any, members: tuple[int, ...], tree: int, level: int, where: str) -> None:
    """all_reduce over the child, then a ring (each member sends to the next, in group-rank order)."""
    if child is None or child is dist.GroupMember.NON_GROUP_MEMBER:
        raise CheckFailed(f"rank {ctx.rank}: {where}: expected a group of {list(members)}, observed {child!r}")
    total = value(tree, level, ctx.rank).to(ctx.device)
    dist.all_reduce(total, group=child)
    want = [sum(column) for column in zip(*(value(tree, level, m).tolist() for m in members))]
    bad = mismatch(total, want, torch.int64)
    ctx.expect(bad is None, f"{where}: all_reduce (SUM) over the child {list(members)}", want, bad)
    if len(members) < 2:
        return
    nxt, prev = _neighbours(members, ctx.rank)
    got = torch.full((ELEMENTS,), -1, dtype=torch.int64, device=ctx.device)
    works = [dist.isend(value(tree, level, ctx.rank).to(ctx.device), nxt, group=child),
             dist.irecv(got, prev, group=child)]
    for work in works:
        work.wait()
    sent = value(tree, level, prev).tolist()
    bad = mismatch(got, sent, torch.int64)
    ctx.expect(bad is None, f"{where}: recv from global rank {prev} in the child's ring", sent, bad)


def _neighbours(members: tuple[int, ...], rank: int) -> tuple[int, int]:
    """The members after and before ``rank`` in the child's ring (group-rank order)."""
    me = members.index(rank)
    return members[(me + 1) % len(members)], members[me - 1]


def _audit(ctx: CheckContext, findings: Findings, since: int, members: tuple[int, ...], parent: Any,
           where: str) -> Any:
    """Judge the communicators recorded since ``since``; return the split communicator's id (None if unseen)."""
    created = new_comms(ctx, since)
    problems = [f"communicator {e.get('comm')} ({e.get('mode')}) records members {e.get('members')} without "
                f"rank {ctx.rank}" for e in created if ctx.rank not in (e.get("members") or ())]
    splits = [e for e in created if e.get("mode") != "p2p"]
    want = [sorted(members), list(members)]  # a probe records them sorted or in the communicator's rank order
    if len(splits) != 1:
        problems.append(f"communicators made for the child {list(members)}: expected 1, observed "
                        f"{[(e.get('comm'), e.get('mode'), e.get('members')) for e in splits]}")
    for event in splits:
        if event.get("members") not in want:
            problems.append(f"members of the child's communicator {event.get('comm')}: expected {want[0]}, observed "
                            f"{event.get('members')}")
        if parent is not None and event.get("parent") != parent:
            problems.append(f"parent of the child's communicator {event.get('comm')}: expected {parent}, observed "
                            f"{event.get('parent')}")
    peers = set(_neighbours(members, ctx.rank)) - {ctx.rank}
    pairs = [sorted((ctx.rank, peer)) for peer in peers]
    for event in created:
        if event.get("mode") == "p2p" and sorted(event.get("members") or ()) not in pairs:
            problems.append(f"pair communicator {event.get('comm')}: expected members one of {pairs}, observed "
                            f"{event.get('members')}")
    findings.failures.extend(f"rank {ctx.rank}: {where}: {p}" for p in problems)
    return splits[0].get("comm") if len(splits) == 1 else None


def dimensions(world_size: int = 3) -> dict[str, tuple[str, ...]]:
    """The trees' dimensions and the values a world of ``world_size`` can hit (``conformance coverage``): a
    group cut into some parts, or a part in neither order, takes three ranks."""
    wide = world_size >= 3
    return {"cut": ("a group of one", "whole", *(("some parts",) if wide else ()), "every rank alone"),
            "order": ("ascending", "descending", *(("drawn",) if wide else ())),
            "parent": ("the world", SAME, DIFFERENT)}


SAME = "a subgroup whose group ranks are its global ranks"
DIFFERENT = "a subgroup whose group ranks differ from its global ranks"


def coverage(drawn: list[Tree]) -> dict[str, set[str]]:
    """Which values of each dimension the splits of ``drawn`` hit."""
    hit: dict[str, set[str]] = {dim: set() for dim in ("cut", "order", "parent")}
    for tree in drawn:
        for level, splits in enumerate(tree):
            for split in splits:
                size = len(split.group)
                cut = ("a group of one" if size == 1 else "whole" if len(split.parts) == 1
                       else "every rank alone" if len(split.parts) == size else "some parts")
                hit["cut"].add(cut)
                for part in (p for p in split.parts if len(p) > 1):
                    order = sorted(part)
                    hit["order"].add("ascending" if list(part) == order else
                                     "descending" if list(part) == order[::-1] else "drawn")
                same = split.group == tuple(range(size))
                hit["parent"].add("the world" if level == 0 else SAME if same else DIFFERENT)
    return hit
