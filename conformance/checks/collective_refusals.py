"""Checks that wrong or inconsistent collective programs are refused, never answered with data.

Three requirements (``collectives.toml``):

- ``COLL-BAD-ARGS-REFUSED``: a rank whose own arguments are wrong (an ``all_gather`` output list whose length
  is not the group size, ``all_to_all_single`` split sizes of the wrong count or sum, an input and output that
  differ beyond dim 0 or have no dim 0) is refused naming what is wrong; when only one rank's arguments are
  wrong, its peers raise too (naming the op or that rank, or a timeout) within the group's timeout. gloo
  checks them locally (c10d ``checkSplitSizes``, ``ProcessGroupGloo::allgather``'s list length, gloo
  ``alltoall.cc:30`` the tensors' sizes: run here); ProcessGroupNCCL checks the split sizes but, by its
  source, not the all_gather list length (not run here: no GPU).
- ``COLL-MISMATCH-REFUSED`` (capability ``mismatch_detection``): members that disagree (different
  collectives, roots, split sizes, shapes, split lists) are refused on every member, naming the calls.
- ``COLL-ABSENT-PEER``: a collective a member never joins raises on the members that did, within the group's
  timeout, as a timeout or naming the missing rank; so does a recv whose peer never sends (named, and from any
  source where the target has it), as a timeout or naming the recv and the peer.

Each refusal case runs on a group of its own (a backend may leave a group unusable after a refusal or a
timeout), with a short timeout where a peer may wait, after a valid call of the same op on the world gave exact
data (the positive control).
Which rank misbehaves and which root is used come from a seeded plan (``cases.Plan``): the first, middle and
last ranks always, and seeded samples.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.cases import Case, Plan
from conformance.checks.collective_cases import refusal_names
from conformance.checks.common import (
    PEER_SLACK_S,
    TIMEOUT_NEEDLE,
    UNSUPPORTED,
    Findings,
    Needle,
    default_mode,
    expect_peer_raises,
    expect_raises,
    finish_work,
    shared_folder,
    work_success,
)
from conformance.checks.finished_works import expect_kept, finish_works
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed
from conformance.targets.base import WorldSpec

GROUP_WAIT_S = 1.0  # the timeout of a refusal case's group where a peer may wait: it fails after this long
ABSENT_WAIT_S = 1.0  # the timeout of the group whose member never joins
# What a wait on a peer that never comes raises: a RuntimeError, as torch's own distributed errors are (DistError,
# DistBackendError, DistStoreError derive from it; gloo: RuntimeError 'Timed out waiting ...', seen), so that the
# user's `except RuntimeError` (or `except dist.DistError` where the backend raises torch's) catches it; Python's
# builtin TimeoutError is an OSError and slips past both
DIST_ERRORS: tuple[type[BaseException], ...] = (RuntimeError,)
BAD_ARGS = ("all_gather: too few outputs", "all_gather: too many outputs", "all_to_all_single: split count",
            "all_to_all_single: split sum")
# input and output do not fit: all_to_all_single's, and the single-tensor gather and scatter's whole one larger or
# smaller than the group size times the other (torch's front end checks neither: v2.13.0 distributed_c10d.py
# all_gather_into_tensor, reduce_scatter_tensor; ProcessGroupNCCL refuses 'output tensor size must be equal to
# world_size times input tensor size' and 'input tensor must be the same size as output size times world size',
# gloo 2.13.0 'invalid tensor size at index 0' and 'Check failed: outputShape[0] * worldSize == inputShape[0]', seen)
BAD_TENSORS = ("all_to_all_single: rows differ", "all_to_all_single: 0-dim input",
               "all_gather_into_tensor: output too large", "all_gather_into_tensor: output too small",
               "reduce_scatter_tensor: input too large", "reduce_scatter_tensor: input too small")
# A bitwise reduction of a floating tensor has no meaning: gloo refuses it on every rank ('Cannot use ReduceOp.BOR
# with non-integral dtype', seen on torch 2.13.0 for all_reduce, reduce and reduce_scatter_tensor, float32 and
# bfloat16), NCCL has no bitwise reduction at all (ProcessGroupNCCL.cpp getNcclReduceOp: 'Cannot use ReduceOp.BAND
# with NCCL', read in a recent copy, version not pinned). Each
# op meets each reducing collective and every floating dtype across these; every rank calls it.
BAD_OPS = ("all_reduce: BOR of float32", "reduce: BAND of bfloat16", "reduce_scatter_tensor: BXOR of float16",
           "all_reduce: BXOR of float64", "reduce: BOR of float32", "reduce_scatter_tensor: BAND of float32")
_FLOATS = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
ROOTED = ("broadcast", "reduce", "gather", "scatter")
MISMATCHES = ("op", *ROOTED, "dtype", "size", "all_to_all_single splits", "all_to_all shapes")


def _ranks(n: int) -> tuple[int, ...]:
    """The boundary values of "which rank": the first, the middle and the last."""
    return tuple(sorted({0, n // 2, n - 1}))


def bad_args_plan(n: int) -> Plan:
    """Which call gets wrong arguments, and on which rank (or on every rank)."""
    # A tensor pair that does not fit is also a disagreement with valid peers, which a backend that compares
    # calls refuses as such: only the same wrong call on every rank reaches the backend's own argument check,
    # so those two calls get a boundary case of their own, on every rank (one rank among the samples).
    return Plan("bad-args", {"call": BAD_ARGS + BAD_TENSORS + BAD_OPS, "wrong on": ("every rank", *_ranks(n))},
                core={"wrong on": ("every rank",)}, alone=BAD_TENSORS + BAD_OPS)


def mismatch_plan(n: int) -> Plan:
    """What the odd rank disagrees on, which rank it is, and the root its peers use."""
    return Plan("mismatch", {"mismatch": MISMATCHES, "odd rank": _ranks(n), "root": _ranks(n)}, alone=())


def absent_plan(n: int) -> Plan:
    """Which op a rank never joins, and which rank: each case waits out a timeout, so only the first and the
    last rank (the check runs its boundary cases only)."""
    return Plan("absent", {"op": ("all_reduce", "broadcast"), "absent rank": (0, n - 1)}, alone=())


def _fresh_group(ctx: CheckContext, timeout_s: float | None, members: list[int] | None = None) -> dist.ProcessGroup:
    """A group of ``members`` (default every rank), used for one refusal case only, after the world is in step
    again; every rank takes part in making it."""
    dist.barrier()
    return ctx.new_group(list(range(ctx.world_size)) if members is None else members, timeout_s=timeout_s)


# ------------------------------------------------------------------ COLL-BAD-ARGS-REFUSED
def _gather_lists(ctx: CheckContext, count: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    return [torch.zeros(3, device=ctx.device) for _ in range(count)], torch.full((3,), float(ctx.rank),
                                                                                  device=ctx.device)


def _control_all_gather(ctx: CheckContext, group: dist.ProcessGroup | None = None,
                        what: str = "positive control", members: list[int] | None = None) -> None:
    """all_gather on ``group`` of ``members`` (default the world) with one output per member: exact."""
    members = list(range(ctx.world_size)) if members is None else members
    outs, inp = _gather_lists(ctx, len(members))
    dist.all_gather(outs, inp, group=group)
    ctx.expect_equal(f"all_gather with one output per member of ranks {members} ({what})",
                     [[float(m)] * 3 for m in members], [o.tolist() for o in outs])


def _a2a_args(ctx: CheckContext, splits: list[int] | None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Rows ``rank * 100 + i``; ``splits`` (default one row per rank) for both sides."""
    n = ctx.world_size
    splits = [1] * n if splits is None else splits
    rows = sum(splits)
    inp = torch.arange(rows, dtype=torch.float32, device=ctx.device) + 100 * ctx.rank
    return torch.full((max(rows, n),), -1.0, device=ctx.device), inp, splits


def _control_all_to_all(ctx: CheckContext, group: dist.ProcessGroup | None = None,
                        what: str = "positive control", members: list[int] | None = None) -> None:
    """all_to_all_single on ``group`` of ``members`` (default the world, in group-rank order) with one row per
    member: exact."""
    members = list(range(ctx.world_size)) if members is None else members
    size, me = len(members), members.index(ctx.rank)
    out, inp, splits = _a2a_args(ctx, [1] * size)
    dist.all_to_all_single(out[:size], inp, splits, splits, group=group)
    ctx.expect_equal(f"all_to_all_single with one row per member of ranks {members} ({what})",
                     [float(100 * m + me) for m in members], out[:size].tolist())


def _control_reduce(ctx: CheckContext, group: dist.ProcessGroup | None = None,
                    what: str = "positive control") -> None:
    mine = torch.full((3,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(mine, group=group)
    ctx.expect_equal(f"all_reduce SUM of float32 ({what})", [float(sum(range(1, ctx.world_size + 1)))] * 3,
                     mine.tolist())


def _bitwise_parts(kind: str) -> tuple[str, str, torch.dtype]:
    """The collective, the op's name and the dtype of a ``BAD_OPS`` kind ("<collective>: <op> of <dtype>")."""
    collective, rest = kind.split(": ")
    op_name, dtype_name = rest.split(" of ")
    return collective, op_name, _FLOATS[dtype_name]


def _bitwise_on_float(ctx: CheckContext, kind: str, group: dist.ProcessGroup) -> Callable[[], Any]:
    """``kind`` on this rank: a bitwise reduction of a floating tensor."""
    collective, op_name, dtype = _bitwise_parts(kind)
    op, n = getattr(dist.ReduceOp, op_name), ctx.world_size
    mine = torch.tensor([3.5, 6.25] * n, dtype=dtype, device=ctx.device) * (ctx.rank + 1)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(mine, op=op, group=group)
    if collective == "reduce":
        return lambda: dist.reduce(mine, dst=n - 1, op=op, group=group)
    shard = torch.zeros(2, dtype=dtype, device=ctx.device)
    return lambda: dist.reduce_scatter_tensor(shard, mine, op=op, group=group)


def _bad_call(ctx: CheckContext, kind: str, group: dist.ProcessGroup) -> Callable[[], Any]:
    """The call with wrong arguments of ``kind`` on this rank."""
    n = ctx.world_size
    if kind in BAD_OPS:
        return _bitwise_on_float(ctx, kind, group)
    if kind in ("all_gather: too few outputs", "all_gather: too many outputs"):
        outs, inp = _gather_lists(ctx, n - 1 if "few" in kind else n + 3)
        return lambda: dist.all_gather(outs, inp, group=group)
    if kind == "all_to_all_single: split count":
        out, inp, splits = _a2a_args(ctx, [1] * (n + 1))  # the right sum, one size too many
        return lambda: dist.all_to_all_single(out[:n + 1], inp, splits, splits, group=group)
    if kind in BAD_TENSORS:
        return _misfit_call(ctx, kind, group)
    out, inp, splits = _a2a_args(ctx, None)  # kind == "all_to_all_single: split sum": n sizes, one row too many
    wrong = [*splits[:-1], 2]
    return lambda: dist.all_to_all_single(out[:n], inp, wrong, splits, group=group)


def _misfit_call(ctx: CheckContext, kind: str, group: dist.ProcessGroup) -> Callable[[], Any]:
    """A call (``BAD_TENSORS``) whose input and output do not fit each other: all_to_all_single's, or
    all_gather_into_tensor's and reduce_scatter_tensor's with one piece of 2 elements per rank, whose whole tensor
    has a piece too many (a tail a backend would leave unwritten) or one element too few."""
    n = ctx.world_size
    if kind == "all_to_all_single: rows differ":  # n rows of 2 elements into n rows of 3, one dtype, no split sizes
        inp2, out3 = torch.ones(n, 2, device=ctx.device), torch.full((n, 3), -1.0, device=ctx.device)
        return lambda: dist.all_to_all_single(out3, inp2, group=group)
    if kind == "all_to_all_single: 0-dim input":  # a scalar into a 1-dim output of one row per rank
        scalar, out1 = torch.tensor(1.0, device=ctx.device), torch.full((n,), -1.0, device=ctx.device)
        return lambda: dist.all_to_all_single(out1, scalar, group=group)
    whole = 2 * n + (2 if "large" in kind else -1)
    if kind.startswith("all_gather"):
        out, inp = torch.full((whole,), -1.0, device=ctx.device), torch.ones(2, device=ctx.device)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    shard, big = torch.full((2,), -1.0, device=ctx.device), torch.ones(whole, device=ctx.device)
    return lambda: dist.reduce_scatter_tensor(shard, big, group=group)


def _bad_needles(ctx: CheckContext, kind: str) -> tuple[Needle, ...]:
    """What the refusal of the rank with wrong arguments must name."""
    n = ctx.world_size
    if kind in BAD_OPS:  # the op or the dtype (or that it is not an integer one), in any of their spellings
        _, op_name, dtype = _bitwise_parts(kind)
        return ((op_name, op_name.lower(), {"BAND": "bitwise_and", "BOR": "bitwise_or", "BXOR": "bitwise_xor"}[op_name],
                 *refusal_names(None, dtype), "integral", "integer", "floating"),)
    if kind.startswith(("all_gather_into_tensor", "reduce_scatter_tensor")):  # NCCL and gloo: "size"; toyccl's
        return (("size", "shape", "numel", "element", "hold"),)  # "input [6] must hold 2 x output [2]"
    if kind.startswith("all_gather"):  # the group size and the number of outputs given
        return (("output", "tensor list"), str(n), str(n - 1 if "few" in kind else n + 3))
    if kind == "all_to_all_single: split count":  # gloo: "Number of tensor splits not equal to group size"
        return (("split",), ("group size", str(n)))
    if kind.startswith("all_to_all_single: split"):  # gloo: "Split sizes doesn't match total dim 0 size"
        return (("split",), ("dim 0", "sum"))
    # rows differ / 0-dim input: the input and output tensors do not fit each other. gloo 2.13.0: "[enforce fail
    # at gloo/alltoall.cc:30] in->size == out->size" (seen, both kinds); the simulator: "input float32[2,2] and
    # output float32[2,3] differ beyond dim 0", "needs tensors with at least one dimension"
    return (("size", "shape", "differ", "dimension"),)


def _valid_call(ctx: CheckContext, op: str, group: dist.ProcessGroup) -> Callable[[], Any]:
    """``op`` with valid arguments (float32, SUM where it reduces), async: returns its Work."""
    n = ctx.world_size
    if op == "all_gather":
        outs, inp = _gather_lists(ctx, n)
        return lambda: dist.all_gather(outs, inp, group=group, async_op=True)
    if op == "all_to_all_single":
        out, inp, splits = _a2a_args(ctx, None)
        return lambda: dist.all_to_all_single(out[:n], inp, splits, splits, group=group, async_op=True)
    mine = torch.ones(2 * n, device=ctx.device)
    if op == "all_gather_into_tensor":
        return lambda: dist.all_gather_into_tensor(mine, torch.ones(2, device=ctx.device), group=group, async_op=True)
    if op == "all_reduce":
        return lambda: dist.all_reduce(mine, group=group, async_op=True)
    if op == "reduce":
        return lambda: dist.reduce(mine, dst=n - 1, group=group, async_op=True)
    return lambda: dist.reduce_scatter_tensor(torch.zeros(2, device=ctx.device), mine, group=group, async_op=True)


def _bad_args_case(ctx: CheckContext, case: Case) -> None:
    kind, bad = case["call"], case["wrong on"]
    # where every rank passes the wrong arguments no peer is left waiting, and the same group's valid call after
    # the refusals needs every rank to arrive: a host under load can hold one rank's refusal back past the short
    # timeout (seen in CI: rank 1 arrived more than 1 s after rank 0), so that group keeps the check's timeout
    group = _fresh_group(ctx, None if bad == "every rank" else GROUP_WAIT_S)
    op = kind.split(":")[0]
    if bad in ("every rank", ctx.rank):
        expect_raises(ctx, f"{case.describe()}: this rank's call", _bad_call(ctx, kind, group),
                      contains=_bad_needles(ctx, kind))
        if bad == "every rank":
            # a refusal changes nothing (NCCL's ArgsCheck and c10d's checks run before anything is enqueued): the
            # same group then runs the op with valid arguments, as a backend that advanced a counter or made state
            # for the refused call does not
            control_op = op if op in ("all_gather", "all_to_all_single") else "all_reduce"  # a reduction's: SUM
            control = {"all_gather": _control_all_gather, "all_to_all_single": _control_all_to_all,
                       "all_reduce": _control_reduce}[control_op]
            after = f"{case.describe()}: the same group after every rank's call was refused"
            try:
                control(ctx, group, after)
            except CheckFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - the finding: a refused call left the group unusable
                raise CheckFailed(f"rank {ctx.rank}: {after}: {control_op} with valid arguments raised "
                                  f"{type(exc).__name__}: {exc}") from None
        return
    # A peer with valid arguments: the op must not complete for it either.
    valid = _valid_call(ctx, op, group)
    call: Callable[[], Any] = lambda: finish_work(ctx, op, valid())  # noqa: E731
    # gloo: a peer whose wait timed out closes its connections, and the others then read "Connection closed by
    # peer" (seen on 2.13.0 at world size 4) before their own timeout: an error about the op all the same
    expect_peer_raises(ctx, f"{case.describe()}: a peer with valid arguments", call,
                 ((op, f"rank {bad}", "connection closed"),), GROUP_WAIT_S)


def _by_group_rank(ctx: CheckContext, op: str, root: int, group: dist.ProcessGroup, size: int) -> Callable[[], Any]:
    """``op`` on ``group`` (of ``size`` members) with its root named by group rank (group_src / group_dst, which
    torch passes to the backend as opts.rootRank unchecked: v2.13.0 distributed_c10d.py:1256, :3134, :3390, :4658,
    :4776); only the root passes a tensor list. Returns the call's Work."""
    mine = torch.full((2,), float(ctx.rank + 1), device=ctx.device)
    is_root = dist.get_group_rank(group, ctx.rank) == root
    lists = [torch.zeros(2, device=ctx.device) for _ in range(size)] if is_root else None
    if op == "broadcast":
        return lambda: dist.broadcast(mine, group=group, group_src=root, async_op=True)
    if op == "reduce":
        return lambda: dist.reduce(mine, group=group, group_dst=root, async_op=True)
    if op == "gather":
        return lambda: dist.gather(mine, lists, group=group, group_dst=root, async_op=True)
    return lambda: dist.scatter(mine, lists, group=group, group_src=root, async_op=True)


def subgroup_ranks(n: int) -> list[int]:
    """The world's last half (rank 1 alone at world size 2): a group smaller than the world whose group ranks are
    not its members' global ranks, so an index checked against the world's size, or read as a global rank, is
    wrongly in range there."""
    return list(range(n // 2, n))


def _member_group(ctx: CheckContext, members: list[int]) -> dist.ProcessGroup | None:
    """``_fresh_group`` of ``members`` with the short timeout; None here when this rank is not a member."""
    group = _fresh_group(ctx, GROUP_WAIT_S, members)
    return group if ctx.rank in members else None


def _root_outside(ctx: CheckContext, op: str, root: int, members: list[int]) -> None:
    """Every member calls ``op`` with a root outside the group of ``members`` (the same on every member): each is
    refused naming the root, as NCCL's argument check does ('Broadcast : invalid root 4 (root should be in the
    0..3 range)', NCCL src/enqueue.cc ArgsCheck) and c10d's assertRootRank in ProcessGroupGloo ('invalid root
    rank: 4', against the group's size), or times out naming it. First the same op from root 0 on the same group
    must run; a target that declines the op there (naming it unsupported) is not judged on it, and that is
    noted."""
    group = _member_group(ctx, members)
    if group is None:
        return
    size = len(members)
    try:
        finish_work(ctx, op, _by_group_rank(ctx, op, 0, group, size)())
    except Exception as exc:  # noqa: BLE001 - a declined op is noted, any other error is a finding
        if any(word in str(exc) for word in UNSUPPORTED):
            ctx.note(f"{op} with a root outside the group: not judged, the target declines {op} ({exc})")
            return
        raise CheckFailed(f"rank {ctx.rank}: {op} from root 0 (before the root outside): {type(exc).__name__}: "
                          f"{exc}") from None
    what = f"{op} with root {root} named by group rank on a group of {size} (ranks {members} of {ctx.world_size})"
    expect_raises(ctx, what, lambda: finish_work(ctx, op, _by_group_rank(ctx, op, root, group, size)()),
                  contains=(("root",), str(root)), timeout_contains=(("root",), str(root)))


def _world_sized_on_subgroup(ctx: CheckContext, op: str, members: list[int]) -> None:
    """Every member of the group of ``members`` calls ``op`` with one output (all_gather) or one split size
    (all_to_all_single) per rank of the world, not of the group: refused naming the group's size or the count
    given, as gloo does against the group (ProcessGroupGloo::allgather's list length, c10d checkSplitSizes). First
    the same op with one per member must give exact data on that group."""
    group = _member_group(ctx, members)
    if group is None:
        return
    size, n = len(members), ctx.world_size
    if op == "all_gather":
        _control_all_gather(ctx, group, "the subgroup", members)
        wrong, inp = _gather_lists(ctx, n)
        expect_raises(ctx, f"all_gather with {n} outputs (one per world rank) on a group of {size}",
                      lambda: dist.all_gather(wrong, inp, group=group),
                      contains=(("output", "tensor list"), str(size), str(n)))
        return
    _control_all_to_all(ctx, group, "the subgroup", members)
    out, inp, _ = _a2a_args(ctx, None)
    expect_raises(ctx, f"all_to_all_single with {n} split sizes (one per world rank) on a group of {size}",
                  lambda: dist.all_to_all_single(out, inp, [1] * n, [1] * n, group=group),
                  contains=(("split",), ("group size", str(size))))


@check("COLL-BAD-ARGS-REFUSED")
def bad_args_refused(ctx: CheckContext) -> None:
    """Wrong arguments are refused naming them; peers of the one rank that passed them never return; a root
    outside the group is refused naming it, also on a subgroup where it is a rank of the world; so are
    world-sized output lists and split sizes on a subgroup."""
    ctx.init_world(default_mode(ctx))
    _control_all_gather(ctx)
    _control_all_to_all(ctx)
    found = Findings(ctx)
    for case in bad_args_plan(ctx.world_size).cases(ctx.generation, ctx.world_size):
        found.case(_bad_args_case, ctx, case)
    world = list(range(ctx.world_size))
    for root in (ctx.world_size, ctx.world_size + 1, 2**31 - 1, -1):  # each side's edge, and past it
        for op in ROOTED:
            found.case(_root_outside, ctx, op, root, world)
    # arguments right for the world, wrong for a smaller group: a bound taken from the world, not the group
    members = subgroup_ranks(ctx.world_size)
    for root in range(len(members), ctx.world_size):
        for op in ROOTED:
            found.case(_root_outside, ctx, op, root, members)
    for op in ("all_gather", "all_to_all_single"):
        found.case(_world_sized_on_subgroup, ctx, op, members)
    dist.barrier()
    found.conclude()


# ------------------------------------------------------------------ COLL-MISMATCH-REFUSED
def _rooted(ctx: CheckContext, op: str, root: int, group: dist.ProcessGroup | None = None) -> Callable[[], Any]:
    """``op`` from ``root`` with this rank's tensor ``rank + 1``; returns what the check compares."""
    n, mine = ctx.world_size, torch.full((2,), float(ctx.rank + 1), device=ctx.device)
    if op == "broadcast":
        return lambda: (dist.broadcast(mine, root, group=group), mine.tolist())[1]
    if op == "reduce":
        return lambda: (dist.reduce(mine, root, group=group), mine.tolist())[1]
    if op == "gather":
        outs = [torch.zeros(2, device=ctx.device) for _ in range(n)] if ctx.rank == root else None
        return lambda: (dist.gather(mine, outs, dst=root, group=group), outs and [o.tolist() for o in outs])[1]
    ins = [torch.full((2,), 10.0 * j, device=ctx.device) for j in range(n)] if ctx.rank == root else None
    return lambda: (dist.scatter(mine, ins, src=root, group=group), mine.tolist())[1]


def _rooted_expected(ctx: CheckContext, op: str, root: int) -> Any:
    n = ctx.world_size
    if op == "broadcast":
        return [float(root + 1)] * 2
    if op == "reduce":
        return [float(n * (n + 1) // 2)] * 2 if ctx.rank == root else [float(ctx.rank + 1)] * 2
    if op == "gather":
        return [[float(j + 1)] * 2 for j in range(n)] if ctx.rank == root else None
    return [10.0 * ctx.rank] * 2


Call = tuple[Callable[[], Any], tuple[Needle, ...]]


def _mismatch_call(ctx: CheckContext, case: Case, group: dist.ProcessGroup) -> Call:
    """This rank's call in a case where rank ``case['odd rank']`` disagrees, and what every refusal must name."""
    kind, odd, n = case["mismatch"], case["odd rank"], ctx.world_size
    me_odd = ctx.rank == odd
    t = torch.ones(4, device=ctx.device)
    if kind == "op":  # all_reduce everywhere, broadcast on the odd rank
        fn = (lambda: dist.broadcast(t, 0, group=group)) if me_odd else (lambda: dist.all_reduce(t, group=group))
        return fn, ("all_reduce", "broadcast")
    if kind in ROOTED:
        root, other = case["root"], (case["root"] + 1) % n
        return _rooted(ctx, kind, other if me_odd else root, group), (kind, ("root",))
    if kind == "dtype":
        x = torch.ones(4, dtype=torch.float64 if me_odd else torch.float32, device=ctx.device)
        return (lambda: dist.all_reduce(x, group=group)), ("all_reduce", ("float64", "double"))
    if kind == "size":
        x = torch.ones(8 if me_odd else 4, device=ctx.device)
        return (lambda: dist.all_reduce(x, group=group)), ("all_reduce", "8")
    if kind == "all_to_all_single splits":  # the odd rank sends its next peer two rows and expects one fewer
        nxt = (odd + 1) % n
        send = [2 if me_odd and j == nxt else 1 for j in range(n)]
        recv = [2 if me_odd and j == nxt else 1 for j in range(n)]  # this rank's own sums stay consistent
        out = torch.full((sum(recv),), -1.0, device=ctx.device)
        inp = torch.ones(sum(send), device=ctx.device)
        return (lambda: dist.all_to_all_single(out, inp, recv, send, group=group)), ("all_to_all", ("split", "rows"))
    # kind == "all_to_all shapes": the odd rank expects 2 elements from every peer, which send 1
    outs = [torch.zeros(2 if me_odd and j != odd else 1, device=ctx.device) for j in range(n)]
    ins = [torch.ones(1, device=ctx.device) for _ in range(n)]
    return (lambda: dist.all_to_all(outs, ins, group=group)), ("all_to_all", ("shape", "size"))


def _mismatch_case(ctx: CheckContext, case: Case) -> None:
    group = _fresh_group(ctx, None)  # a backend that declares mismatch_detection refuses at once: no short timeout
    fn, needles = _mismatch_call(ctx, case, group)
    expect_raises(ctx, case.describe(), fn, contains=needles)


def _split_disagree(ctx: CheckContext, odd: int) -> None:
    """split_group where rank ``odd`` asks for a different split than its peers: refused on every rank."""
    n = ctx.world_size
    everyone, singles = [list(range(n))], [[r] for r in range(n)]
    split = singles if ctx.rank == odd else everyone
    expect_raises(ctx, f"split_group with rank {odd} asking for {singles} and the others for {everyone}",
                  lambda: dist.split_group(split_ranks=split, timeout=timedelta(seconds=GROUP_WAIT_S)),
                  contains=(("split",), ("asked", "disagree", "differ", "mismatch")))


@check("COLL-MISMATCH-REFUSED")
def mismatch_refused(ctx: CheckContext) -> None:
    """Members that disagree on a collective are refused on every member, naming the disagreement."""
    ctx.init_world(default_mode(ctx))
    found = Findings(ctx)
    for op in ROOTED:  # the positive control: each rooted op from a non-zero root gives exact data
        root = ctx.world_size - 1
        got = _rooted(ctx, op, root)()
        found.case(ctx.expect_equal, f"{op} from root {root} (positive control)", _rooted_expected(ctx, op, root), got)
    _control_all_to_all(ctx)
    for case in mismatch_plan(ctx.world_size).cases(ctx.generation, ctx.world_size):
        found.case(_mismatch_case, ctx, case)
    if "split" in ctx.target.capabilities:
        dist.barrier()
        for odd in _ranks(ctx.world_size):
            found.case(_split_disagree, ctx, odd)
    else:
        ctx.note("split_group with disagreeing split lists not tried: the target lacks capability split")
    dist.barrier()
    found.conclude()


# ------------------------------------------------------------------ COLL-ABSENT-PEER
@dataclass(frozen=True)
class Pending:
    """An op issued without waiting: ``wait`` waits for it, or raises what issuing raised (then ``work`` is
    None: a backend whose async ops block raises at the call)."""

    wait: Callable[[], None]
    work: dist.Work | None


def _pending(ctx: CheckContext, what: str, issue: Callable[[], dist.Work]) -> Pending:
    try:
        work = issue()
    except Exception as exc:  # noqa: BLE001 - judged by the caller's expect_raises, as if raised by the wait
        error = exc

        def reraise() -> None:
            raise error
        return Pending(reraise, None)
    return Pending(lambda: finish_work(ctx, what, work), work)


def _issue(ctx: CheckContext, op: str, group: dist.ProcessGroup, absent: int) -> Pending:
    """Issue ``op`` on ``group`` without waiting."""
    t = torch.ones(4, device=ctx.device)
    return _pending(ctx, op, lambda: dist.all_reduce(t, group=group, async_op=True) if op == "all_reduce"
                    else dist.broadcast(t, absent, group=group, async_op=True))


def _stays_failed(ctx: CheckContext, what: str, pending: Pending, needles: tuple[Needle, ...]) -> None:
    """A Work whose wait() raised stays failed, as c10d's Work defines one (v2.13.0
    torch/csrc/distributed/c10d/Work.hpp: wait() is 'while (!isCompleted()); if (!isSuccess())
    rethrow(exception())'): is_completed() is True, is_success() False (NCCL's deprecation refusal noted),
    exception() holds the error, a second wait() raises again, as the first did (gloo: seen for a timed-out
    all_reduce and irecv), and the Work's future is done and raises the error too (c10d's Work completes its
    future with the error, Work::finish; a caller chaining on get_future() must not read the unfilled outputs);
    a target whose Work has no future ('getFuture not implemented': gloo's send and recv) is noted. Not judged
    where the call itself raised (no Work)."""
    work = pending.work
    if work is None:
        return
    ctx.expect_equal(f"{what}: work.is_completed() after its wait() raised", True, work.is_completed())
    success = work_success(ctx, what, work)
    if success is not None:
        ctx.expect_equal(f"{what}: work.is_success() after its wait() raised", False, success)
    ctx.expect(work.exception() is not None, f"{what}: work.exception() after its wait() raised", "the error",
               None)
    expect_raises(ctx, f"{what}: a second wait() of the failed work", pending.wait, DIST_ERRORS, contains=needles,
                  timeout_contains=(TIMEOUT_NEEDLE,))
    if ctx.target.traits.timed_wait_aborts:
        ctx.note(f"{what}: wait(timeout) of the failed work not tried: on this target a timed wait aborts the "
                 "group's communicator")
    else:  # c10d's Work::wait(timeout) rethrows a failed Work's exception whatever the timeout (Work.cpp)
        expect_raises(ctx, f"{what}: wait(timeout={ABSENT_WAIT_S} s) of the failed work",
                      lambda: work.wait(timedelta(seconds=ABSENT_WAIT_S)), DIST_ERRORS, contains=needles,
                      timeout_contains=(TIMEOUT_NEEDLE,))
    if ctx.target.traits.future_done_at_launch:
        ctx.note(f"{what}: the target completes a Work's future at launch: its failure through the future not "
                 "judged")
        return
    try:
        future = work.get_future()
    except RuntimeError as exc:
        if "not implemented" not in str(exc):
            raise CheckFailed(f"rank {ctx.rank}: {what}: work.get_future() of the failed work: expected its future, "
                              f"observed RuntimeError: {exc}") from None
        ctx.note(f"{what}: the work has no future ({exc}): its failure through the future not judged")
        return
    ctx.expect_equal(f"{what}: get_future().done() after its wait() raised", True, future.done())
    expect_raises(ctx, f"{what}: get_future().wait() of the failed work", future.wait, DIST_ERRORS, contains=needles,
                  timeout_contains=(TIMEOUT_NEEDLE,))


@check("COLL-ABSENT-PEER")
def absent_peer(ctx: CheckContext) -> None:
    """A collective one member never joins raises on the others within the group's timeout. The cases run at
    once, each on a group of its own (each waits out a timeout): boundary cases only, no samples."""
    ctx.init_world(default_mode(ctx))
    t = torch.ones(4, device=ctx.device)
    dist.all_reduce(t)
    ctx.expect_equal("all_reduce of ones over the world (positive control)", [float(ctx.world_size)] * 4, t.tolist())
    cases = absent_plan(ctx.world_size).cases(replace(ctx.generation, budget=0), ctx.world_size)
    groups = [_fresh_group(ctx, ABSENT_WAIT_S) for _ in cases]
    # each group's finished Works (all its members present) must outlive the failure of its later op (not on GPU
    # targets: whether a finished WorkNCCL reports the error of its aborted communicator was not verified)
    finished = [] if ctx.target.target.gpu else [
        op for k, group in enumerate(groups)
        for op in finish_works(ctx, group, list(range(ctx.world_size)), f"case {k}'s group, before its op")]
    anysource = "p2p_any_source" in ctx.target.capabilities
    # with p2p_any_source, rank 0 also posts a recv from any source on a group of the check's world (bound where
    # the target binds a device), which no rank sends to: it waits out the same time as the cases above
    any_group = _fresh_group(ctx, ABSENT_WAIT_S) if anysource else None
    issued = [(case, time.monotonic(), _issue(ctx, case["op"], group, case["absent rank"]))
              for case, group in zip(cases, groups, strict=True) if case["absent rank"] != ctx.rank]
    any_start = time.monotonic()
    any_wait = _receive(ctx, any_group, None).wait if any_group is not None and ctx.rank == 0 else None
    found = Findings(ctx)
    for case, start, pending in issued:
        absent = case["absent rank"]
        what, needles = f"{case.describe()}: {case['op']} that rank {absent} never joins", \
            ((f"rank {absent}", f"rank(s) {absent}"),)
        found.case(expect_peer_raises, ctx, what, pending.wait, needles, ABSENT_WAIT_S, start, kinds=DIST_ERRORS)
        found.case(_stays_failed, ctx, what, pending, needles)
    found.case(expect_kept, ctx, finished, "after a later op of its group failed")
    if any_wait is not None:
        what = f"recv from any source on a group of the check's world ({default_mode(ctx)} init), which no rank " \
               "sends to"
        found.case(_recv_raises, ctx, what, any_wait, _any_peer(ctx), any_start)
    dist.barrier()
    _absent_sender(ctx, found)  # every rank goes on (a failed case is recorded), so the ranks stay in step
    _absent_on_file_store(ctx, found)
    found.conclude()


def _absent_on_file_store(ctx: CheckContext, found: Findings) -> None:
    """The same on a lazily initialised world whose store is a FileStore (file:// init), not a TCPStore: an
    all_reduce the last rank never joins, on a fresh group, raises on the others within its timeout (a backend
    that waits for a peer's arrival in the store cannot lean on the TCPStore's own timeout there)."""
    n, absent = ctx.world_size, ctx.world_size - 1
    with shared_folder(ctx, "absent") as folder:  # the FileStore's
        dist.barrier()
        dist.destroy_process_group()
        ctx.target.init_world(dist.FileStore(str(folder / "store"), n), ctx.rank, n, WorldSpec(mode="lazy"),
                              ctx.timeout_s)
        group = ctx.new_group(list(range(n)), timeout_s=ABSENT_WAIT_S)
        if ctx.rank != absent:
            start = time.monotonic()
            pending = _issue(ctx, "all_reduce", group, absent)
            found.case(expect_peer_raises, ctx, f"all_reduce that rank {absent} never joins, on a FileStore world "
                       "(lazy init)", pending.wait, ((f"rank {absent}", f"rank(s) {absent}"),), ABSENT_WAIT_S, start,
                       kinds=DIST_ERRORS)
        dist.barrier()


def _partner(ctx: CheckContext) -> int | None:
    """This rank's P2P partner: ranks pair up 0-1, 2-3, ... (the last rank of an odd world has none)."""
    peer = ctx.rank ^ 1
    return peer if peer < ctx.world_size else None


def _receive(ctx: CheckContext, group: dist.ProcessGroup, src: int | None) -> Pending:
    """Post a receive from ``src`` (None: any source) on ``group``."""
    t = torch.zeros(4, device=ctx.device)
    return _pending(ctx, "recv", lambda: dist.irecv(t, src=src, group=group))


def _absent_sender(ctx: CheckContext, found: Findings) -> None:
    """The P2P analogue, in a lazy world (P2P on pair communicators where the target makes them, as NCCL's lazy
    init does): after an exchange between partners gave exact data (the positive control), on groups of their
    own with a short timeout, each even rank posts a recv from its partner (the next rank) and rank 0 (with
    ``p2p_any_source``) a recv from any source; nobody sends, and the other ranks wait at a barrier of the
    world. Each recv must raise within the group's timeout plus slack: as a timeout (gloo: 'Timed out waiting
    1000ms for recv operation to complete', naming no peer; toyccl: its store's 'wait timeout after 1000ms,
    keys: ...p2p/1->0...') or, as another error, naming the recv and the peer it waited for.
    (Only one side of a pair waits: on gloo a recv's timeout closes its side of the pair, which a peer still
    waiting in a recv of its own reports as 'Connection closed by peer'.)"""
    anysource = "p2p_any_source" in ctx.target.capabilities
    dist.destroy_process_group()
    ctx.init_world("lazy")
    peer = _partner(ctx)
    if peer is not None:
        mine = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
        got = torch.zeros(4, device=ctx.device)
        for work in (dist.isend(mine, peer), dist.irecv(got, peer)):
            finish_work(ctx, "send/recv between partners", work)
        ctx.expect_equal(f"recv from rank {peer} (positive control)", [float(peer + 1)] * 4, got.tolist())
    named, anyg = _fresh_group(ctx, ABSENT_WAIT_S), _fresh_group(ctx, ABSENT_WAIT_S)
    start = time.monotonic()
    waits = []
    if peer is not None and ctx.rank % 2 == 0:
        waits.append((f"recv from rank {peer}, which never sends", _receive(ctx, named, peer),
                      (f"rank {peer}", f"ranks {peer}", f"rank(s) {peer}")))
    if anysource and ctx.rank == 0:
        waits.append(("recv from any source on a lazy group, which no rank sends to", _receive(ctx, anyg, None),
                      _any_peer(ctx)))
    elif not anysource:
        ctx.note("recv(src=None) whose peers never send not tried: the target lacks capability p2p_any_source")
    for what, pending, peer_named in waits:
        found.case(_recv_raises, ctx, what, pending.wait, peer_named, start)
        found.case(_stays_failed, ctx, what, pending, ("recv", peer_named))
    dist.barrier()
    if peer is not None:  # each even rank's recv from its partner failed: the partner now sends on that group
        even = min(ctx.rank, peer)
        found.case(_p2p_after_failed_receive, ctx, named, even, even + 1, f"recv from rank {even + 1}")
    dist.barrier()
    if anysource:
        found.case(_p2p_after_failed_receive, ctx, anyg, 0, 1, "recv from any source")
        dist.barrier()


def _p2p_after_failed_receive(ctx: CheckContext, group: dist.ProcessGroup, receiver: int, sender: int,
                              failed: str) -> None:
    """After ``receiver``'s ``failed`` receive on ``group`` raised, ``sender`` sends it a tensor on that group and
    ``receiver`` receives it from ``sender``: each call returns (the data exact) or raises, within the group's timeout
    plus slack; a failed receive must not leave the group's later P2P hanging (gloo closes the pair and raises at
    once, 'Application timeout caused pair closure' and 'Connection closed by peer', seen on 2.13.0; NCCL aborts the
    communicator). Each call runs in a thread of its own, so that one that hangs is reported, not waited on."""
    if ctx.rank not in (receiver, sender):
        return
    limit = ABSENT_WAIT_S + PEER_SLACK_S
    sent = [6.0, -2.5, float(sender)]
    receiving = ctx.rank == receiver
    buf = torch.zeros(3, device=ctx.device) if receiving else torch.tensor(sent, device=ctx.device)
    what = (f"{f'recv from rank {sender}' if receiving else f'send to rank {receiver}'} on the group where rank "
            f"{receiver}'s {failed} had just failed")
    errors: list[BaseException | None] = []

    def call() -> None:
        try:
            if receiving:
                dist.recv(buf, src=sender, group=group)
            else:
                dist.send(buf, dst=receiver, group=group)
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - any error is an answer; only a hang is not
            errors.append(exc)

    caller = threading.Thread(target=call, name="p2p-after-failed-receive", daemon=True)
    caller.start()
    caller.join(limit)
    if caller.is_alive():
        raise CheckFailed(f"rank {ctx.rank}: {what}: expected it to return or raise within {limit} s, observed it "
                          "still blocked")
    if errors[0] is not None:
        ctx.note(f"{what}: raised {type(errors[0]).__name__}: {str(errors[0])[:160]}")
    elif receiving:
        ctx.expect_equal(f"{what}: the data", sent, buf.tolist())


def _any_peer(ctx: CheckContext) -> Needle:
    """What an any-source recv's error (other than a timeout) names as its peer: 'any' or a peer's rank."""
    others = [str(q) for q in range(ctx.world_size) if q != ctx.rank]
    return ("any", *(f"rank {q}" for q in others), *(f"ranks {q}" for q in others))


def _recv_raises(ctx: CheckContext, what: str, wait: Callable[[], None], peer_named: Needle, start: float) -> None:
    """``wait`` must raise within the group's timeout plus slack: a timeout (as in the collective cases), or
    another error naming the recv and the peer."""
    expect_raises(ctx, what, wait, DIST_ERRORS, contains=("recv", peer_named), timeout_contains=(TIMEOUT_NEEDLE,))
    took = time.monotonic() - start
    limit = ABSENT_WAIT_S + (ctx.target.traits.p2p_wait_timeout_s or 0.0) + PEER_SLACK_S
    ctx.expect(took <= limit, f"{what}: seconds until the error", f"<= {limit}", round(took, 1))
