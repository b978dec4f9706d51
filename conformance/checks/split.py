"""Checks for split-group parent binding."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from conformance.checks.common import (
    PEER_SLACK_S,
    TIMEOUT_NEEDLE,
    expect_allreduce_members,
    expect_peer_raises,
    expect_raises,
    finish_work,
    group_shapes,
    new_comms,
    require_fields,
    world_comm,
)
from conformance.checks.derived_groups import check_derived_groups
from conformance.checks.registry import CheckContext, check
from conformance.checks.split_trees import check_split_trees
from conformance.outcomes import CheckFailed
from conformance.torch_compat import (
    members_only_new_group_refused,
    new_group_splits,
    split_child_ranks,
    split_nonmember_value,
)


@check("SPLIT-UNBOUND-REFUSED")
def unbound_refused(ctx: CheckContext) -> None:
    """split_group on a lazily initialised world is refused with torch's error."""
    ctx.init_world("lazy")
    expect_raises(ctx, "split_group on an unbound parent",
                  lambda: dist.split_group(split_ranks=[list(range(ctx.world_size))]),
                  (RuntimeError,), ("No device associated with the default pg",))


@check("SPLIT-BOUND-INHERIT")
def bound_inherit(ctx: CheckContext) -> None:
    """Children of a bound parent carry its device, in the group and in the communicator; so do groups made by
    new_group from the bound world (torch reads a group's bound_device_id, e.g. for barrier's device, v2.13.0
    distributed_c10d.py:5332-5334; torch binds the group it built, v2.13.0 :2096, then uses the ProcessGroup an
    extended-API creator returns in its place, :2278-2279, so such a backend must carry the binding over)."""
    world = ctx.init_world("eager")
    parent = world_comm(ctx)
    since = ctx.probe.mark()
    child = dist.split_group(split_ranks=[list(range(ctx.world_size))])
    ctx.expect(child is not None, "split_group of the whole world on a member", "a group", child)
    ctx.expect(world.bound_device_id is not None, "the parent's bound device", "a device", None)
    ctx.expect_equal("child.bound_device_id", world.bound_device_id, child.bound_device_id)
    created = new_comms(ctx, since)
    ctx.expect_equal("communicators created by the split", 1, len(created))
    require_fields(ctx, [parent], "device")  # the probe records devices at all; a child without one is the defect
    ctx.expect_equal("the world communicator's device (the device the world is bound to, index included)",
                     str(world.bound_device_id), parent["device"])
    ctx.expect_equal("child communicator's device", parent["device"], created[0]["device"])
    expect_allreduce_members(ctx, child, list(range(ctx.world_size)), "child of the world")
    upper, sub, _ = _upper_subgroup(ctx)
    everyone = ctx.new_group(list(range(ctx.world_size)))
    ctx.expect_equal("new_group of every rank: bound_device_id", world.bound_device_id,
                     getattr(everyone, "bound_device_id", None))
    if sub is None:
        return
    ctx.expect_equal(f"new_group {upper}: bound_device_id", world.bound_device_id,
                     getattr(sub, "bound_device_id", None))
    since = ctx.probe.mark()
    grandchild = dist.split_group(parent_pg=sub, split_ranks=[list(range(len(upper)))])
    what = f"child of the subgroup {upper}"
    ctx.expect_equal(f"{what}: bound_device_id", world.bound_device_id, getattr(grandchild, "bound_device_id", None))
    created = new_comms(ctx, since)
    ctx.expect_equal(f"{what}: communicators created by the split", 1, len(created))
    ctx.expect_equal(f"{what}: communicator's device", parent["device"], created[0]["device"])
    expect_allreduce_members(ctx, grandchild, upper, what)


def _upper_subgroup(ctx: CheckContext) -> tuple[list[int], dist.ProcessGroup | None, dict | None]:
    """new_group of the ranks above 0 (group ranks differ from global ranks), every rank calling; members get
    the group and its communicator's comm_created event, the others None."""
    upper = list(range(1, ctx.world_size)) or [0]
    since = ctx.probe.mark()
    sub = ctx.new_group(upper)
    if ctx.rank not in upper:
        return upper, None, None
    made = [e for e in new_comms(ctx, since) if e.get("members") == upper]
    return upper, sub, (made[0] if made else None)


@check("SPLIT-MEMBERSHIP")
def membership(ctx: CheckContext) -> None:
    """Members get their global ranks in torch's order, non-members torch's value, for every UCC shape."""
    ctx.init_world("eager")
    nonmember = split_nonmember_value()
    for shape, groups in group_shapes(ctx.world_size).items():
        mine = next((split_child_ranks(g) for g in groups if ctx.rank in g), None)
        child = dist.split_group(split_ranks=groups)
        if mine is None:
            ctx.expect(_is_nonmember(child, nonmember), f"shape {shape}: split_group on a non-member",
                       nonmember, child)
            continue
        ctx.expect(child is not None, f"shape {shape}: split_group on a member", "a group", child)
        ctx.expect_equal(f"shape {shape}: child's global ranks", mine, dist.get_process_group_ranks(child))
        ctx.expect_equal(f"shape {shape}: my rank in the child", mine.index(ctx.rank), dist.get_rank(child))
        expect_allreduce_members(ctx, child, mine, f"shape {shape}")
    upper, sub, _ = _upper_subgroup(ctx)
    if sub is None:
        return
    for shape, groups in group_shapes(len(upper)).items():  # in the subgroup's own group ranks
        child = dist.split_group(parent_pg=sub, split_ranks=groups)
        mine = next((split_child_ranks([upper[i] for i in g]) for g in groups if upper.index(ctx.rank) in g), None)
        what = f"subgroup {upper} split as {shape} {groups}"
        if mine is None:
            ctx.expect(_is_nonmember(child, nonmember), f"{what}: on a non-member", nonmember, child)
            continue
        ctx.expect(child is not None, f"{what}: on a member", "a group", child)
        ctx.expect_equal(f"{what}: child's global ranks", mine, dist.get_process_group_ranks(child))
        expect_allreduce_members(ctx, child, mine, what)


@check("SPLIT-PARTIAL-NONMEMBER")
def partial_nonmember(ctx: CheckContext) -> None:
    """Ranks in no group of a partial split get torch's non-member value, without exception or hang."""
    ctx.init_world("eager")
    members = list(range(max(1, ctx.world_size // 2)))
    try:
        child = dist.split_group(split_ranks=[members])
    except Exception as exc:  # noqa: BLE001 - any exception is the failure being checked
        role = "member" if ctx.rank in members else "non-member"
        raise CheckFailed(f"rank {ctx.rank}: partial split {members}: {role} raised "
                          f"{type(exc).__name__}: {exc}") from None
    if ctx.rank not in members:
        nonmember = split_nonmember_value()
        ctx.expect(_is_nonmember(child, nonmember), f"partial split {members}: non-member's result", nonmember, child)
    else:
        ctx.expect(child is not None, f"partial split {members}: member's result", "a group", child)
        expect_allreduce_members(ctx, child, members, f"partial split {members}")
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(ctx.world_size)), "world after the partial split")


def _is_nonmember(child: object, nonmember: object) -> bool:
    """``child`` is torch's non-member value (None, or the GroupMember.NON_GROUP_MEMBER int)."""
    return child is None if nonmember is None else type(child) is int and child == nonmember


@check("SPLIT-NEWGROUP-SINGLETON")
def newgroup_singleton(ctx: CheckContext) -> None:
    """new_group([0]) under eager init: rank 0 gets a working group, the others the non-member value."""
    ctx.init_world("eager")
    group = ctx.new_group([0])
    if ctx.rank == 0:
        ctx.expect(isinstance(group, dist.ProcessGroup), "new_group([0]) on rank 0", "a ProcessGroup", group)
        expect_allreduce_members(ctx, group, [0], "new_group([0])")
    else:
        ctx.expect(group == dist.GroupMember.NON_GROUP_MEMBER, "new_group([0]) on a non-member",
                   "GroupMember.NON_GROUP_MEMBER", group)
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(ctx.world_size)), "world after new_group([0])")


@check("SPLIT-NEWGROUP-NONMEMBERS")
def newgroup_nonmembers(ctx: CheckContext) -> None:
    """An eager new_group every rank calls, leaving the last rank out (and, from 3 ranks, the first too):
    members get a working group of exactly those ranks, non-members NON_GROUP_MEMBER. Made with torch's own
    new_group (not CheckContext.new_group, which makes such groups with split_group where a stack needs it)."""
    ctx.init_world("eager")
    n = ctx.world_size
    timeout = timedelta(seconds=ctx.timeout_s)
    shapes = [list(range(n - 1))] + ([list(range(1, n - 1))] if n >= 3 else [])
    for ranks in shapes:
        role = "member" if ctx.rank in ranks else "non-member"
        try:
            group = dist.new_group(ranks, timeout=timeout)
        except Exception as exc:
            raise CheckFailed(f"rank {ctx.rank}: new_group({ranks}) on a {role}: expected "
                              f"{'a ProcessGroup' if role == 'member' else 'GroupMember.NON_GROUP_MEMBER'}, observed "
                              f"{type(exc).__name__}: {exc}") from exc
        if ctx.rank in ranks:
            ctx.expect(isinstance(group, dist.ProcessGroup), f"new_group({ranks}) on a member", "a ProcessGroup", group)
            ctx.expect_equal(f"new_group({ranks}): its ranks", ranks, dist.get_process_group_ranks(group))
            expect_allreduce_members(ctx, group, ranks, f"new_group({ranks})")
        else:
            ctx.expect(group == dist.GroupMember.NON_GROUP_MEMBER, f"new_group({ranks}) on a non-member",
                       "GroupMember.NON_GROUP_MEMBER", group)
    # last (torch 2.15 counts a members-only group on its members alone: a later new_group of every rank would get
    # another name on them, v2.15.0 distributed_c10d.py:6758-6771), of the ranks in every group above (torch 2.13
    # salts its name with the number of groups the rank knows, v2.13.0 :5464-5468: the members must know as many)
    _members_only_gloo(ctx, sorted(set.intersection(*map(set, shapes))))
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(n)), "world after the new_groups")


def _members_only_gloo(ctx: CheckContext, ranks: list[int]) -> None:
    """new_group(ranks, backend="gloo", use_local_synchronization=True), called by the members alone beside the
    bound world: a gloo group is not split from the world's communicator (torch passes split_from to NCCL's
    options only, v2.13.0 distributed_c10d.py:2200-2204), so the members get a working group of exactly ``ranks``.
    Where torch makes every new_group through split_group (2.13's torchcomms routing) it refuses the call
    instead, naming use_local_synchronization (v2.13.0 :5893-5898)."""
    what = f"new_group({ranks}, backend='gloo', use_local_synchronization=True), called by its members alone"
    if ctx.rank in ranks:
        make = lambda: dist.new_group(ranks, backend="gloo", use_local_synchronization=True,  # noqa: E731
                                      timeout=timedelta(seconds=ctx.timeout_s))
        if members_only_new_group_refused(ctx.target.target.stack):
            expect_raises(ctx, what, make, contains=("use_local_synchronization",))
        else:
            group = make()
            ctx.expect(isinstance(group, dist.ProcessGroup), what, "a ProcessGroup", group)
            ctx.expect_equal(f"{what}: its backend", "gloo", dist.get_backend(group))
            t = torch.tensor([float(ctx.rank + 1)])
            dist.all_reduce(t, group=group)
            ctx.expect_equal(f"{what}: all_reduce of (global rank + 1) over the group",
                             float(sum(m + 1 for m in ranks)), t.item())
    dist.barrier()


@check("SPLIT-VALIDATION")
def validation(ctx: CheckContext) -> None:
    """Bad split lists are refused on every rank; the world stays usable."""
    ctx.init_world("eager")
    n = ctx.world_size
    cases = {  # what the refusal must name: the offending value (or, for an empty list, that it is empty)
        "empty split list": ([], ("empty",)),
        "an empty group": ([[]], ("empty",)),
        "duplicate ranks": ([[0, 0]], (("duplicate", "twice", "more than once", "[0, 0]"),)),
        "a group larger than the world": ([list(range(n + 1))], ((str(n), "world_size"),)),
        "an out-of-range rank": ([[0, n]], (str(n),)),
        # above the group size, not only at it: a bound written `r != size` (or `is not`) still refuses n;
        # torch decides none of these two on any version checked (v2.13.0 distributed_c10d.py:5672-5682,
        # v2.15.0 :6972-6980: emptiness, size and duplicates only), so the backend must
        "a rank above the group size": ([[0, n + 1]], (str(n + 1),)),
        "a negative rank": ([[0, -1]], ("-1",)),
    }
    for what, (split, needles) in cases.items():
        expect_raises(ctx, f"split_group with {what} {split}", lambda s=split: dist.split_group(split_ranks=s),
                      (ValueError,), needles)
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(n)), "world after refused splits")


@check("SPLIT-NEWGROUP-NAMES")
def newgroup_names(ctx: CheckContext) -> None:
    """Groups made twice from the same ranks have distinct names, their own communicators, and all work."""
    ctx.init_world("eager")
    ranks = list(range(ctx.world_size))
    since = ctx.probe.mark()
    made = [ctx.new_group(ranks), ctx.new_group(ranks), dist.split_group(split_ranks=[ranks]),
            dist.split_group(split_ranks=[ranks])]
    names = [g.group_name for g in made]
    ctx.expect(len(set(names)) == len(names), "group names of repeated groups", "all distinct", names)
    if "comm_created" in ctx.probe.observes:  # two groups on one communicator are not independent
        comms = [e["comm"] for e in new_comms(ctx, since)]
        ctx.expect(len(comms) == len(made) and len(set(comms)) == len(comms),
                   "communicators of the repeated groups", f"{len(made)} distinct", comms)
    tensors = [torch.full((4,), float((ctx.rank + 1) * 10**i), device=ctx.device) for i in range(len(made))]
    works = [dist.all_reduce(t, group=g, async_op=True) for t, g in zip(tensors, made)]
    for w in works:
        w.wait()
    for i, t in enumerate(tensors):
        want = float(sum((r + 1) * 10**i for r in ranks))
        ctx.expect_equal(f"repeated group #{i}: concurrent all_reduce result", want, t[0].item())


@check("SPLIT-LINEAGE")
def lineage(ctx: CheckContext) -> None:
    """Children of an eager parent are split from the parent's communicator (a new_group's, where the stack
    makes it afresh on the running torch, is a fresh one: torch_compat.new_group_splits)."""
    ctx.init_world("eager")
    parent = world_comm(ctx)
    # what a new_group's communicator is: (parent, mode)
    from_new_group = (parent["comm"], "split") if new_group_splits(ctx.target.target.stack) else (None, "eager")
    since = ctx.probe.mark()
    dist.split_group(split_ranks=[list(range(ctx.world_size))])
    ctx.new_group(list(range(ctx.world_size)))
    created = new_comms(ctx, since)
    ctx.expect_equal("communicators created by split_group + new_group", 2, len(created))
    for event, (parent_id, mode) in zip(created, [(parent["comm"], "split"), from_new_group]):
        ctx.expect_equal(f"parent of communicator {event['comm']}", parent_id, event["parent"])
        ctx.expect_equal(f"creation mode of communicator {event['comm']}", mode, event["mode"])
    upper, sub, sub_comm = _upper_subgroup(ctx)
    if sub is None:
        return
    ctx.expect(sub_comm is not None, f"communicator of new_group({upper}) seen by the probe", "one", None)
    ctx.expect_equal(f"parent of new_group({upper})'s communicator", from_new_group[0], sub_comm["parent"])
    since = ctx.probe.mark()
    dist.split_group(parent_pg=sub, split_ranks=[list(range(len(upper)))])
    created = new_comms(ctx, since)
    ctx.expect_equal(f"communicators created by splitting the subgroup {upper}", 1, len(created))
    ctx.expect_equal(f"parent of the subgroup {upper}'s child", sub_comm["comm"], created[0]["parent"])
    ctx.expect_equal(f"creation mode of the subgroup {upper}'s child", "split", created[0]["mode"])


@check("SPLIT-DERIVED-GROUPS")
def derived_groups(ctx: CheckContext) -> None:
    """Derived groups keep their source's members for every order and offset."""
    ctx.init_world("eager" if "device_binding" in ctx.target.capabilities else "lazy")
    check_derived_groups(ctx)
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(ctx.world_size)), "world after the derived groups")


SPLIT_WAIT_S = 1.0  # the timeout split_group is given (the world's is the check's timeout)


@check("SPLIT-TIMEOUT")
def split_timeout(ctx: CheckContext) -> None:
    """A split_group child honours the timeout split_group was given, not its parent's: an all_reduce on it that
    the last rank never joins fails on the others within about that time, naming a timeout."""
    ctx.init_world("eager")
    n, absent = ctx.world_size, ctx.world_size - 1
    child = dist.split_group(split_ranks=[list(range(n))], timeout=timedelta(seconds=SPLIT_WAIT_S))
    ctx.expect(child is not None, "split_group of the whole world on a member", "a group", child)
    expect_allreduce_members(ctx, child, list(range(n)), f"split_group child (timeout {SPLIT_WAIT_S} s)")
    if ctx.rank != absent:
        what = f"all_reduce on the child (timeout {SPLIT_WAIT_S} s, world {ctx.timeout_s} s) rank {absent} never joins"
        t = torch.ones(4, device=ctx.device)
        # the slack must keep the bound below the parent's timeout (the check's), else a child that kept its
        # parent's passes
        expect_peer_raises(ctx, what, lambda: finish_work(ctx, "all_reduce", dist.all_reduce(t, group=child,
                                                                                              async_op=True)),
                           (TIMEOUT_NEEDLE,), SPLIT_WAIT_S, slack_s=min(PEER_SLACK_S, ctx.timeout_s / 2))
    dist.barrier()
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(n)), "world after the child's timeout")


@check("SPLIT-TREES")
def split_trees(ctx: CheckContext) -> None:
    """Seeded split trees three levels deep: each child's communicator records its global ranks and parent."""
    check_split_trees(ctx)
