"""Checks for plain collective correctness: the floor every certified backend stands on.

Every expected value is computed on each rank from the known inputs of all ranks (reference.py),
never taken from another output of the backend. Cases a backend may decline (AVG, bitwise ops, bool,
low-precision dtypes, non-contiguous views) must be refused with an error naming the op or dtype,
and the refusal is noted in the report; SUM, PRODUCT, MIN and MAX on float32, float64 and int64 must run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import (
    agreement,  # noqa: F401 - registers COLL-ALLREDUCE-AGREE, of this area
    collective_refusals,  # noqa: F401 - registers the refusal checks of this area
)
from conformance.checks import collective_cases as cc
from conformance.checks import reference as ref
from conformance.checks.common import (
    LONG_RUN,
    LONG_RUN_LATE_S,
    SCALAR_WORDS,
    UNSORTED,
    UNSUPPORTED,
    Findings,
    default_mode,
    expect_exact,
    expect_raises,
    optional_case,
    positive_control,
    post,
    sweep_groups,
)
from conformance.checks.complex_dtypes import check_complex
from conformance.checks.generated import run_plan
from conformance.checks.grad_tensors import check_grad_tensors
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed

REQUIRED_DTYPES = cc.REQUIRED_DTYPES
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool)
_ALIASES = {torch.bfloat16: ("bfloat16", "BFloat16"), torch.float16: ("float16", "Half"),
            torch.uint8: ("uint8", "Byte"), torch.bool: ("bool",), torch.int64: ("int64", "Long"),
            torch.float32: ("float32", "Float"), torch.float64: ("float64", "Double")}
LATE_S = 0.5
# the sweep's all_reduce sizes: a few elements, and an odd count past every option value (max_ctas 16) and 32,
# so that a data path partitioned by an option or a power of two shows its seams
SWEEP_NUMELS = (7, 37)


def _applicable(op: str, dtype: torch.dtype) -> bool:
    """Bitwise ops are defined on integer dtypes only (torch has no float bitwise); AVG on floating dtypes
    only (an integer or bool average has no agreed rounding: NCCL truncates, gloo has no AVG)."""
    if op in ref.BITWISE:
        return not dtype.is_floating_point
    return op != "AVG" or dtype.is_floating_point


def _ulps(op: str, n: int) -> int:
    """AVG over a group whose size is not a power of two rounds; everything else here is exact."""
    return 2 if op == "AVG" and n & (n - 1) else 0


def _refusal_names(op: str | None, dtype: torch.dtype, *extra: str) -> tuple[str, ...]:
    return (*(() if op is None else (op,)), *_ALIASES.get(dtype, (ref.dtype_name(dtype),)), *extra)


def _run_case(ctx: CheckContext, what: str, required: bool, names: tuple[str, ...], fn: Callable[[], None],
              kind: str | None = None) -> bool:
    """Run ``fn``; a required case's error propagates (an error outcome), an optional one may be refused
    naming ``names`` (noted), alike on every group: its ``kind`` (default: ``what`` less its group label) ran
    everywhere or nowhere (``optional_case``)."""
    if required:
        fn()
        return True
    return optional_case(ctx, what, fn, names, kind=kind or what.split(": ", 1)[-1])


# Fixed-width integers wrap (uint8 200 + 100 = 44): 0-dim, one-element and longer tensors whose sum leaves the range
WRAP_DTYPES = (torch.int64, torch.int32, torch.int8, torch.uint8)
WRAP_SHAPES = ((), (1,), (7,))


def _wrap_row(rank: int, dtype: torch.dtype, numel: int) -> list[int]:
    """``rank``'s input: the maximum less the rank (one element); with more, also the minimum plus the rank (for a
    signed type), the extremes themselves and small values."""
    info = torch.iinfo(dtype)
    row = [info.max - rank, info.min + rank if info.min < 0 else rank, info.max, info.min, 1, 0, 3]
    return row[:numel]


def _integer_wrap_case(ctx: CheckContext) -> None:
    """all_reduce SUM of integer tensors whose exact sum lies outside the dtype's range comes back wrapped modulo
    2**bits, as NCCL's and gloo's kernels add in the dtype and torch's own integer addition does (a backend that adds
    small tensors as Python numbers raises or saturates instead); int64 is required, the others may be refused naming
    the dtype."""
    world = list(range(ctx.world_size))
    for dtype in WRAP_DTYPES:
        for shape in WRAP_SHAPES:
            numel = math.prod(shape)
            rows = {m: _wrap_row(m, dtype, numel) for m in world}
            mine = ref.tensor(rows[ctx.rank], dtype, ctx.device).reshape(shape)
            what = f"world: all_reduce SUM of {ref.dtype_name(dtype)}{list(shape)} past the dtype's range"
            if not _run_case(ctx, what, dtype in REQUIRED_DTYPES, _refusal_names("SUM", dtype),
                             lambda t=mine: dist.all_reduce(t)):
                continue
            bad = ref.mismatch(mine, ref.combine([rows[m] for m in world], "SUM", dtype), dtype)
            if bad:
                raise CheckFailed(f"rank {ctx.rank}: {what} (wrapped modulo 2**bits): {bad}")


def _all_reduce_case(ctx: CheckContext, group: Any, members: list[int], label: str, op: str, dtype: torch.dtype,
                     numel: int = 7, view: bool = False, salt: int = 0, scalar: bool = False) -> None:
    """One all_reduce of known inputs over ``group``, compared with the exact reduction of all members' inputs;
    ``scalar``: of a 0-dim tensor (``numel`` 1), which must keep its shape."""
    inputs = {m: ref.values(m, numel, dtype, salt, op) for m in members}
    mine = ref.tensor(inputs[ctx.rank], dtype, ctx.device)
    if scalar:
        mine = mine.reshape(())
    shape = "[] (0-dim)" if scalar else f"[{numel}]"
    what = f"{label}: all_reduce {op} of {ref.dtype_name(dtype)}{shape}{' (non-contiguous view)' if view else ''}"
    if view:  # every other column of a wider tensor; the columns between must stay untouched
        backing = torch.full((numel, 2), 77, dtype=dtype, device=ctx.device) if dtype != torch.bool else \
            torch.ones((numel, 2), dtype=dtype, device=ctx.device)
        backing[:, 0] = mine
        target = backing[:, 0]
    else:
        target = mine
    names = _refusal_names(op, dtype, *(("contiguous",) if view else ()))
    ran = _run_case(ctx, what, cc.required_reduction(ctx, op, dtype) and not view, names,
                    lambda: dist.all_reduce(target, op=ref.REDUCE_OPS[op], group=group))
    if not ran:
        return
    want = ref.combine([inputs[m] for m in members], op, dtype)
    bad = ref.mismatch(target, want, dtype, _ulps(op, len(members)))
    if bad:
        raise CheckFailed(f"rank {ctx.rank}: {what} over members {members}: {bad}")
    ctx.expect_equal(f"{what}: the tensor's shape after the op", list(mine.shape), list(target.shape))
    if view:
        untouched = backing[:, 1].cpu().tolist()
        ctx.expect(untouched == [untouched[0]] * numel, f"{what}: columns outside the view", "unchanged",
                   untouched)


INF = float("inf")


def _special_contribution(rank: int, n: int, element: int) -> float:
    """Element ``element`` of ``rank``'s input: +inf on rank 0 among 1s; +inf everywhere; -inf on the last rank
    among 2s; +inf on rank 0 and -inf on the last among 1s (at world size 1: +inf)."""
    last = rank == n - 1
    return ((INF if rank == 0 else 1.0), INF, (-INF if last else 2.0),
            (INF if rank == 0 else -INF if last else 1.0))[element]


# Per-element bases of the integer AVG case: negative, past 32 bits (int64) or near 2**26 (int32: the sum of a
# world of 8 stays inside int32, as NCCL's SumPostDiv sums before it divides), and small; even, so that the odd
# offsets make contributions the world size does not divide (dividing each before summing rounds them)
# bases that need every bit: 2**40 + 3 and 2**26 + 1 lie past float32's 24-bit mantissa, so an average computed
# in float32 (an integer sum divided as a float) comes back off by a few units
INTEGER_AVG_BASES = ((torch.int64, (-8, 2**40 + 3, 12344)), (torch.int32, (-8, 2**26 + 1, 6)))


def _avg_offset(rank: int, n: int) -> int:
    """Rank ``rank``'s offset from the bases: +k and -k for the pair (2k-2, 2k-1), 0 for an odd world's last rank:
    the offsets sum to 0, so the average is the bases exactly, whatever the integer rounding."""
    return 0 if n % 2 and rank == n - 1 else (1 if rank % 2 == 0 else -1) * (rank // 2 + 1)


def _integer_avg_case(ctx: CheckContext) -> None:
    """all_reduce AVG of int64 and int32 whose sum divides by the world size: the exact average (NCCL runs integer
    AVG as SumPostDiv, a sum divided by the rank count; no rounding question arises here), or a refusal naming
    AVG or the dtype on every rank (gloo on torch 2.13 divides in float: 'result type Float can't be cast to the
    desired output type Long', seen)."""
    for dtype, bases in INTEGER_AVG_BASES:
        offset = _avg_offset(ctx.rank, ctx.world_size)
        t = torch.tensor([b + offset * (2 * j + 1) for j, b in enumerate(bases)], dtype=dtype, device=ctx.device)
        what = (f"world: all_reduce AVG of {ref.dtype_name(dtype)}[3] whose sum divides by the world size (rank "
                f"{ctx.rank}'s input the bases {list(bases)} {offset:+d} x (1, 3, 5))")
        names = cc.refusal_names("AVG", dtype)
        if optional_case(ctx, what, lambda t=t: dist.all_reduce(t, op=dist.ReduceOp.AVG), names,
                         kind=f"integer AVG of {ref.dtype_name(dtype)}"):
            expect_exact(ctx, t, list(bases), what)


def _sparse_input(rank: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s dense values for the sparse case: rank + 1 at two coordinates of its own, 1 at a shared one."""
    dense = torch.zeros(n + 1, 4)
    dense[rank, rank % 4] = rank + 1
    dense[rank + 1, (rank + 2) % 4] = rank + 1
    dense[0, 3] += 1
    return dense


def _uncoalesced(dense: torch.Tensor) -> torch.Tensor:
    """``dense`` as an uncoalesced sparse COO tensor: each nonzero v given twice, as v - 1 and 1, last first."""
    coo = dense.to_sparse()
    idx, val = coo.indices(), coo.values()
    values = torch.cat([(val - 1).flip(0), torch.ones_like(val)])
    return torch.sparse_coo_tensor(torch.cat([idx.flip(1), idx], 1), values, dense.shape)


def _expect_coalesced_sum(ctx: CheckContext, t: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """The sparse result is the exact sum, and coalesced, as gloo returns it (ProcessGroupGlooDetail.hpp of torch
    2.13.0, AsyncSparseAllreduceWork: ``return output.coalesce()``, :531; seen on gloo 2.13 also for an uncoalesced
    input): its indices() and values() are readable and are those of the sum's coalesced form."""
    expect_exact(ctx, t.to_dense().reshape(-1), want.reshape(-1).tolist(), what)
    ctx.expect_equal(f"{what}: result.is_coalesced()", True, t.is_coalesced())
    if t.is_coalesced():
        form = want.to_sparse()
        ctx.expect_equal(f"{what}: result.indices()", form.indices().tolist(), t.indices().tolist())
        expect_exact(ctx, t.values(), form.values().tolist(), f"{what}: result.values()")


def _sparse_case(ctx: CheckContext) -> None:
    """all_reduce SUM of a sparse COO tensor (rank r holds r + 1 at two coordinates of its own and 1 at a shared
    one), coalesced and given uncoalesced (each entry as two duplicates): the exact sum, coalesced, or a refusal
    naming sparse tensors on every rank (NCCL refuses: 'NCCL does not support all_reduce with sparse tensors',
    ProcessGroupNCCL.cpp allreduce_sparse; gloo sums them, seen on torch 2.13)."""
    n, r = ctx.world_size, ctx.rank
    want = sum(_sparse_input(k, n) for k in range(n))
    for form, given in (("a", _sparse_input(r, n).to_sparse()), ("an uncoalesced", _uncoalesced(_sparse_input(r, n)))):
        t = given.to(ctx.device)
        what = (f"world: all_reduce SUM of {form} sparse COO float32[{n + 1}, 4] (rank {r}'s entries r + 1 and one "
                "shared 1)")
        if optional_case(ctx, what, lambda t=t: dist.all_reduce(t), ("sparse",), kind="all_reduce of a sparse tensor"):
            _expect_coalesced_sum(ctx, t, want, what)


def _special_values_case(ctx: CheckContext) -> None:
    """all_reduce of float32 and float64 with +-inf among finite values, for SUM, AVG, MAX, MIN and PRODUCT: the
    IEEE result of folding the ranks' values (inf stays inf, inf + -inf is NaN, inf * -inf is -inf), as a backend
    that adds in its dtype gives it whatever the order (NCCL's and gloo's kernels do; no NaN is an input, so no
    NaN-ordering rule of MAX and MIN is judged). A backend whose summation trick subtracts inf from inf (Kahan
    compensation) gives NaN where the sum is inf."""
    n = ctx.world_size
    for dtype in (torch.float32, torch.float64):
        for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
            t = torch.tensor([_special_contribution(ctx.rank, n, e) for e in range(4)], dtype=dtype,
                             device=ctx.device)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            want = []
            for e in range(4):
                values = [_special_contribution(r, n, e) for r in range(n)]
                folded = values[0]
                for v in values[1:]:
                    folded = (max(folded, v) if op == "MAX" else min(folded, v) if op == "MIN" else
                              folded * v if op == "PRODUCT" else folded + v)
                want.append(folded / n if op == "AVG" else folded)
            got = t.cpu().double().tolist()
            ctx.expect(_same_ieee(got, want), f"all_reduce {op} of {dtype} with +-inf among finite values (IEEE)",
                       want, got)


def _same_ieee(got: list[float], want: list[float]) -> bool:
    """Element by element equal, a NaN where one is wanted counting as equal (NaN != NaN)."""
    return all(math.isnan(g) if math.isnan(w) else g == w for g, w in zip(got, want, strict=True))


def _nan_input(rank: int, n: int) -> list[float]:
    """A member's four elements: NaN on the last rank, on rank 0, on none and on every one; rank + 1 elsewhere."""
    finite = float(rank + 1)
    return [math.nan if rank == n - 1 else finite, math.nan if rank == 0 else finite, finite, math.nan]


def _nan_case(ctx: CheckContext) -> None:
    """A NaN from any member makes the element NaN in SUM, AVG and PRODUCT (IEEE: every add and multiply with a NaN
    gives NaN, in whatever order the members are folded), in all_reduce, reduce_scatter_tensor and reduce (on the
    root), for float32, float64 and bfloat16; the element no member makes NaN is exact. A reduction that skips NaNs
    (nansum) hides a diverged rank. MAX and MIN with a NaN are not judged (NaN-ordering rules differ). An op or
    dtype a backend lacks may be refused naming it."""
    n, r = ctx.world_size, ctx.rank
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for op in ("SUM", "AVG", "PRODUCT"):
            finite = [float(k + 1) for k in range(n)]
            folded = math.prod(finite) if op == "PRODUCT" else sum(finite) / (n if op == "AVG" else 1)
            want = [math.nan, math.nan, folded, math.nan]
            for kind in ("all_reduce", "reduce_scatter_tensor", "reduce"):
                what = f"world: {kind} {op} of {ref.dtype_name(dtype)}[4] with a NaN from some members"
                mine = torch.tensor(_nan_input(r, n), dtype=dtype, device=ctx.device)
                out = torch.empty_like(mine) if kind == "reduce_scatter_tensor" else mine
                if not _run_case(ctx, what, cc.required_reduction(ctx, op, dtype), _refusal_names(op, dtype),
                                 lambda k=kind, o=out, m=mine, p=op: _nan_reduce(k, o, m, p, n)):
                    continue
                if kind == "reduce" and r != n - 1:
                    continue
                got = out.cpu().double().tolist()
                ctx.expect(_same_ieee(got, want),
                           f"{what}{' (on the root)' if kind == 'reduce' else ''} (IEEE: NaN propagates)", want, got)


def _nan_reduce(kind: str, out: torch.Tensor, mine: torch.Tensor, op: str, n: int) -> None:
    """One reduction of ``mine`` into ``out``: reduce_scatter_tensor reduces ``mine`` repeated n times (each
    member's shard is the reduction of the members' ``mine``); reduce goes to the last rank."""
    reduce_op = ref.REDUCE_OPS[op]
    if kind == "all_reduce":
        dist.all_reduce(out, op=reduce_op)
    elif kind == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(out, mine.repeat(n), op=reduce_op)
    else:
        dist.reduce(out, n - 1, op=reduce_op)


def _premul_sum_case(ctx: CheckContext) -> None:
    """all_reduce with dist._make_nccl_premul_sum(2.0) (torch builds it for NCCL; its front end passes it to any
    backend, v2.13.0 distributed_c10d.py all_reduce): the exact 2 x sum, or a refusal naming PREMUL_SUM (gloo:
    'Cannot use ReduceOp.PREMUL_SUM with Gloo', seen on 2.13.0), never one naming another op; then SUM is exact."""
    n = ctx.world_size
    t = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    what = "world: all_reduce PREMUL_SUM (dist._make_nccl_premul_sum(2.0)) of float32[4]"
    if optional_case(ctx, what, lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)), ("PREMUL_SUM",)):
        want = [float(n * (n + 1))] * 4  # 2.0 x (1 + ... + n), exact in float32
        expect_exact(ctx, t, want, what)
    after = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(after)
    want = [float(n * (n + 1) // 2)] * 4
    expect_exact(ctx, after, want, f"{what}: then all_reduce SUM")


# the 1-based op numbers of the long run before which its rank 1 comes late: around each window's end
LONG_RUN_LATE = frozenset(2**k + d for k in range(5, 11) for d in (-1, 0, 1))


def _long_run_case(ctx: CheckContext) -> None:
    """``LONG_RUN`` all_reduce SUMs of one int64 element on a new group of ranks 0 and 1 (a window's reuse does not
    depend on the group's size; two members keep the run's cost alike at every world size), op k's input
    k * 1000 + rank: each result exact (a stale contribution of op k - 2**j shows as a sum off by a multiple of
    1000). Rank 1 sleeps ``LONG_RUN_LATE_S`` before each op of ``LONG_RUN_LATE``, so that rank 0 reaches a reused key
    or slot first. The other ranks only make the group."""
    if ctx.world_size < 2:
        return
    group = ctx.new_group([0, 1])
    if ctx.rank > 1:
        return
    wrong: list[str] = []
    t = torch.zeros(1, dtype=torch.int64, device=ctx.device)
    for k in range(1, LONG_RUN + 1):
        if ctx.rank == 1 and k in LONG_RUN_LATE:
            time.sleep(LONG_RUN_LATE_S)
        t.fill_(k * 1000 + ctx.rank)
        dist.all_reduce(t, group=group)
        want = 2 * k * 1000 + 1
        if len(wrong) < 3 and int(t.item()) != want:
            wrong.append(f"op #{k}: expected {want}, observed {int(t.item())}")
    if wrong:
        raise CheckFailed(f"rank {ctx.rank}: {LONG_RUN} all_reduce SUMs in a row on the group of ranks 0 and 1 (op "
                          f"k's input k * 1000 + rank; rank 1 late by {LONG_RUN_LATE_S} s around ops 2**k): "
                          + "; ".join(wrong))


@check("COLL-ALLREDUCE-OPS")
def allreduce_ops(ctx: CheckContext) -> None:
    """all_reduce: every reduce op x dtype on the world; shapes; the reduce ops over every group shape."""
    mode = default_mode(ctx)
    ctx.init_world(mode)
    world = list(range(ctx.world_size))
    found = Findings(ctx)
    for op in ref.REDUCE_OPS:
        for dtype in DTYPES:
            if _applicable(op, dtype):
                found.case(_all_reduce_case, ctx, None, world, "world", op, dtype)
    for dtype in (torch.float32, torch.int64):
        for op in ("SUM", "MAX"):
            found.case(_all_reduce_case, ctx, None, world, "world", op, dtype, numel=0, salt=1)
            found.case(_all_reduce_case, ctx, None, world, "world", op, dtype, numel=1025, salt=2)
    for op in ref.REDUCE_OPS:  # a 0-dim tensor (a loss, a norm, a flag): every op, as the world's dtypes allow
        for dtype in (torch.float32, torch.int64):
            if _applicable(op, dtype):
                found.case(_all_reduce_case, ctx, None, world, "world", op, dtype, numel=1, salt=3, scalar=True)
    found.case(_premul_sum_case, ctx)
    found.case(_special_values_case, ctx)
    found.case(_nan_case, ctx)
    found.case(_integer_avg_case, ctx)
    found.case(_integer_wrap_case, ctx)
    found.case(_sparse_case, ctx)
    found.case(_long_run_case, ctx)
    run_plan(ctx, found, cc.ALL_REDUCE, lambda c: cc.all_reduce_case(ctx, None, world, "world", c), world, "world")
    found.checkpoint()
    for label, group, members in sweep_groups(ctx, split_ok=mode == "eager" and "split" in ctx.target.capabilities):
        for op, dtype in (("SUM", torch.float32), ("AVG", torch.float32), ("MAX", torch.int64),
                          ("MIN", torch.int64), ("PRODUCT", torch.float64), ("SUM", torch.bfloat16)):
            for numel in SWEEP_NUMELS:
                found.case(_all_reduce_case, ctx, group, members, label, op, dtype, numel=numel, salt=5)
    found.conclude()


def _gather_cases(ctx: CheckContext, group: Any, members: list[int], label: str) -> None:
    n, me = len(members), members.index(ctx.rank)
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        required = dtype in REQUIRED_DTYPES
        inputs = {m: ref.values(m, 3, dtype, salt=11) for m in members}
        mine = ref.tensor(inputs[ctx.rank], dtype, ctx.device)
        gathered = [v for m in members for v in inputs[m]]
        what = f"{label}: all_gather_into_tensor of {ref.dtype_name(dtype)}[3]"
        out = torch.zeros(3 * n, dtype=dtype, device=ctx.device)
        if _run_case(ctx, what, required, _refusal_names(None, dtype),
                     lambda o=out, t=mine: dist.all_gather_into_tensor(o, t, group=group)):
            bad = ref.mismatch(out, gathered, dtype)
            ctx.expect(bad is None, f"{what} in group-rank order {members}", "each member's input in order", bad)
        outs = [torch.zeros(3, dtype=dtype, device=ctx.device) for _ in members]
        what = f"{label}: all_gather (list) of {ref.dtype_name(dtype)}[3]"
        if _run_case(ctx, what, required, _refusal_names(None, dtype),
                     lambda o=outs, t=mine: dist.all_gather(o, t, group=group)):
            for j, m in enumerate(members):
                bad = ref.mismatch(outs[j], inputs[m], dtype)
                ctx.expect(bad is None, f"{what}: slot {j}", f"rank {m}'s input", bad)
        for op in ("SUM", "MAX"):
            full = {m: ref.values(m, 2 * n, dtype, salt=13, op=op) for m in members}
            reduced = ref.combine([full[m] for m in members], op, dtype)
            shard = reduced[2 * me:2 * me + 2]
            out1 = torch.zeros(2, dtype=dtype, device=ctx.device)
            inp1 = ref.tensor(full[ctx.rank], dtype, ctx.device)
            what = f"{label}: reduce_scatter_tensor {op} of {ref.dtype_name(dtype)}[{2 * n}]"
            if _run_case(ctx, what, required, _refusal_names(op, dtype),
                         lambda o=out1, t=inp1, op=op:
                         dist.reduce_scatter_tensor(o, t, op=ref.REDUCE_OPS[op], group=group)):
                bad = ref.mismatch(out1, shard, dtype)
                ctx.expect(bad is None, f"{what}: shard {me} of the reduced tensor", shard, bad)
        chunks = [ref.tensor(ref.values(ctx.rank, 2, dtype, salt=17 + j), dtype, ctx.device) for j in range(n)]
        want = ref.combine([ref.values(m, 2, dtype, salt=17 + me) for m in members], "SUM", dtype)
        out2 = torch.zeros(2, dtype=dtype, device=ctx.device)
        what = f"{label}: reduce_scatter (list) SUM of {ref.dtype_name(dtype)}"  # torch 2.13 says "No backend
        # type associated with device type" when the backend lacks the method: accepted as its refusal. gloo runs
        # it (2.13.0, 2.15.0): a refusal must say the op (or dtype) is unsupported, not merely name the op
        if optional_case(ctx, what, lambda o=out2, c=chunks: dist.reduce_scatter(o, c, group=group),
                         UNSUPPORTED, kind=what.split(": ", 1)[-1]):
            bad = ref.mismatch(out2, want, dtype)
            ctx.expect(bad is None, f"{what}: chunk {me} of every member's list", want, bad)


# int64 elements past 4 MiB: where a stack may reduce a tensor chunk by chunk, one chunk per rank (the
# simulator's fabric does from 4 MiB); the generated plan's MiB sizes are contiguous
LARGE_VIEW_NUMEL = (4 << 20) // 8 + 4


def _large_view_case(ctx: CheckContext, world: list[int], root: int | None) -> None:
    """all_reduce (``root`` None) or reduce to ``root`` of the transpose of a LARGE_VIEW_NUMEL / 2 x 2 int64
    tensor (non-contiguous, no flat view of it exists; its storage no larger than the view, so a backend
    that ships whole storages moves no more than for a contiguous tensor): element i of its row-major order
    holds i * (m + 1) + m on rank m; the SUM is exact."""
    n, numel = len(world), LARGE_VIEW_NUMEL
    base = torch.arange(numel, dtype=torch.int64).view(2, numel // 2)
    view = torch.empty((numel // 2, 2), dtype=torch.int64, device=ctx.device).t()
    view.copy_(base * (ctx.rank + 1) + ctx.rank)
    op = "all_reduce" if root is None else f"reduce to rank {root}"
    what = f"world: {op} SUM of a transposed int64[2, {numel // 2}] view ({numel * 8} bytes)"
    call = (lambda: dist.all_reduce(view)) if root is None else (lambda: dist.reduce(view, dst=root))
    if not _run_case(ctx, what, False, ("contiguous", "Contiguous", "dense"), call,
                     kind=f"{'all_reduce' if root is None else 'reduce'} SUM of a transposed int64 view"):
        return
    if root is not None and ctx.rank != root:
        return
    want = (base * (n * (n + 1) // 2) + n * (n - 1) // 2).reshape(-1)
    got = view.cpu().reshape(-1)
    wrong = (got != want).nonzero()
    if len(wrong):
        i = int(wrong[0])
        raise CheckFailed(f"rank {ctx.rank}: {what}: element {i} (row-major) is {int(got[i])}, expected "
                          f"{int(want[i])} ({len(wrong)} of {numel} wrong)")


@check("COLL-NONCONTIGUOUS")
def noncontiguous(ctx: CheckContext) -> None:
    """Collectives on non-contiguous views (all_reduce, broadcast, reduce, the gathers, reduce_scatter_tensor): exact
    (the rest untouched) or refused naming contiguity."""
    ctx.init_world(default_mode(ctx))
    world = list(range(ctx.world_size))
    found = Findings(ctx)
    for dtype in (torch.float32, torch.int64):
        for op in ("SUM", "MAX"):
            found.case(_all_reduce_case, ctx, None, world, "world", op, dtype, numel=5, view=True, salt=3)
        root = ctx.world_size - 1
        backing = torch.zeros((5, 2), dtype=dtype, device=ctx.device)
        backing[:, 0] = ref.tensor(ref.values(ctx.rank, 5, dtype, salt=4), dtype, ctx.device)
        what = f"world: broadcast of a non-contiguous {ref.dtype_name(dtype)}[5] view from rank {root}"
        if optional_case(ctx, what, lambda b=backing, r=root: dist.broadcast(b[:, 0], src=r), ("contiguous",)):
            bad = ref.mismatch(backing[:, 0], ref.values(root, 5, dtype, salt=4), dtype)
            found.case(ctx.expect_equal, f"{what}: column outside the view", [0] * 5,
                       backing[:, 1].cpu().long().tolist())
            found.case(ctx.expect, bad is None, what, f"rank {root}'s input", bad)
    for root in (None, ctx.world_size - 1):
        found.case(_large_view_case, ctx, world, root)
    found.checkpoint()
    for label, group, members in sweep_groups(ctx):
        if label == "world" or members == list(range(1, ctx.world_size)):
            run_plan(ctx, found, cc.NONCONTIGUOUS, lambda c, g=group, m=members, lb=label:
                     cc.noncontiguous_case(ctx, g, m, lb, c), members, label)
    found.conclude()


@check("COLL-GATHER-SCATTER-ORDER")
def gather_scatter_order(ctx: CheckContext) -> None:
    """all_gather(_into_tensor) lays members out in group-rank order; reduce_scatter gives each its own shard."""
    mode = default_mode(ctx)
    ctx.init_world(mode)
    found = Findings(ctx)
    for label, group, members in sweep_groups(ctx, split_ok=mode == "eager" and "split" in ctx.target.capabilities):
        found.case(_gather_cases, ctx, group, members, label)
        if label == "world" or members == list(range(1, ctx.world_size)):  # the unsorted group: hand-picked
            run_plan(ctx, found, cc.GATHER, lambda c, g=group, m=members, lb=label: cc.gather_case(ctx, g, m, lb, c),
                     members, label)
            run_plan(ctx, found, cc.IN_PLACE, lambda c, g=group, m=members, lb=label:
                     cc.in_place_case(ctx, g, m, lb, c), members, label)
            run_plan(ctx, found, cc.ARRIVAL_GATHER, lambda c, g=group, m=members, lb=label:
                     cc.gather_case(ctx, g, m, lb, c), members, label)
    found.case(_reduce_scatter_tensor_bad_input, ctx)
    found.case(_scalar_pieces, ctx)
    found.conclude()


def _scalar_pieces(ctx: CheckContext) -> None:
    """Each rank's piece a 0-dim tensor (rank r's value 10 r + 1, float32): all_gather_into_tensor into [n],
    all_gather into n 0-dim outputs, broadcast from the last rank, reduce SUM to it: exact, and every tensor the
    caller passed keeps its shape (a backend must not reshape the caller's tensor in place, ``unsqueeze_``), or
    refused naming the size or shape, alike on every rank. Not reduce_scatter_tensor into a 0-dim output: gloo
    reads its dim 0 and the process dies (SIGSEGV, seen on 2.13.0), which no check can report past."""
    n, dev, last = ctx.world_size, ctx.device, ctx.world_size - 1
    value = [10.0 * r + 1 for r in range(n)]
    mine = torch.tensor(value[ctx.rank], device=dev)
    gathered, slots = torch.zeros(n, device=dev), [torch.zeros((), device=dev) for _ in range(n)]
    root_t, reduce_t = mine.clone(), mine.clone()
    cases = [
        ("all_gather_into_tensor of 0-dim pieces into [n]", lambda: dist.all_gather_into_tensor(gathered, mine),
         [(mine, [], [value[ctx.rank]]), (gathered, [n], value)]),
        ("all_gather of 0-dim pieces into n 0-dim outputs", lambda: dist.all_gather(slots, mine),
         [(mine, [], [value[ctx.rank]]), *((slots[j], [], [value[j]]) for j in range(n))]),
        (f"broadcast of a 0-dim tensor from rank {last}", lambda: dist.broadcast(root_t, last),
         [(root_t, [], [value[last]])]),
        (f"reduce SUM of a 0-dim tensor to rank {last}", lambda: dist.reduce(reduce_t, last),
         [(reduce_t, [], [sum(value) if ctx.rank == last else value[ctx.rank]])]),
    ]
    for name, call, tensors in cases:
        what = f"world: {name}"
        if not optional_case(ctx, what, call, SCALAR_WORDS, kind=what):
            continue
        for k, (t, shape, want) in enumerate(tensors):
            if t is reduce_t and ctx.rank != last:
                continue  # a non-root's tensor may serve as scratch (gloo)
            ctx.expect_equal(f"{what}: tensor {k}'s shape after the op", shape, list(t.shape))
            ctx.expect_equal(f"{what}: tensor {k}'s values", want, t.reshape(-1).tolist())


def _reduce_scatter_tensor_bad_input(ctx: CheckContext) -> None:
    """reduce_scatter_tensor of an input of 3n elements, 2n - 1 (one short) or n (a chunk short), into an output
    of 2 is refused on every rank naming the input's size (torch checks only that each is one tensor, v2.13.0
    distributed_c10d.py:4913-4914 in reduce_scatter_single: the size check is the backend's; gloo: 'Check failed:
    outputShape[0] * worldSize == inputShape[0] (4 vs. 6)', seen on 2.13.0 and 2.15.0); then a correctly sized
    one is exact."""
    n, dev = ctx.world_size, ctx.device
    for numel in (3 * n, 2 * n - 1, n):
        what = f"world: reduce_scatter_tensor of float32[{numel}] into float32[2]"
        out, inp = torch.zeros(2, device=dev), torch.zeros(numel, device=dev)
        expect_raises(ctx, what, lambda o=out, i=inp: dist.reduce_scatter_tensor(o, i),
                      contains=(("input",), str(numel)))
    out = torch.zeros(2, device=dev)
    dist.reduce_scatter_tensor(out, torch.arange(2 * n, dtype=torch.float32, device=dev) + ctx.rank)
    want = [float(n * (2 * ctx.rank + i) + n * (n - 1) // 2) for i in range(2)]
    expect_exact(ctx, out, want, f"{what}: then float32[{2 * n}] into float32[2]")


@check("COLL-ROOTED")
def rooted(ctx: CheckContext) -> None:
    """broadcast and reduce from every root, non-zero ones included, on every group shape."""
    ctx.init_world("lazy")  # subgroups of a lazy world: each communicator is created lazily, on first use
    found = Findings(ctx)
    for label, group, members in sweep_groups(ctx):
        for root in members[::-1]:
            for dtype in (torch.float32, torch.int64):
                inputs = {m: ref.values(m, 5, dtype, salt=root) for m in members}
                t = ref.tensor(inputs[ctx.rank], dtype, ctx.device)
                what = f"{label}: broadcast of {ref.dtype_name(dtype)} from global rank {root}"
                found.case(_run_case, ctx, what, True, (),
                           lambda t=t, r=root, g=group: dist.broadcast(t, src=r, group=g))
                bad = ref.mismatch(t, inputs[root], dtype)
                found.case(ctx.expect, bad is None, what, f"rank {root}'s input", bad)
                for op in ("SUM", "MAX"):
                    t = ref.tensor(inputs[ctx.rank], dtype, ctx.device)
                    what = f"{label}: reduce {op} of {ref.dtype_name(dtype)} to global rank {root}"
                    found.case(_run_case, ctx, what, True, (), lambda t=t, r=root, g=group, p=ref.REDUCE_OPS[op]:
                               dist.reduce(t, dst=r, op=p, group=g))
                    if ctx.rank == root:
                        want = ref.combine([inputs[m] for m in members], op, dtype)
                        bad = ref.mismatch(t, want, dtype)
                        found.case(ctx.expect, bad is None, what, want, bad)
        if label in ("world", UNSORTED) or members == list(range(1, ctx.world_size)):  # group rank != global
            run_plan(ctx, found, cc.rooted_plan(len(members), big=label == "world"),
                     lambda c, g=group, m=members, lb=label: cc.rooted_case(ctx, g, m, lb, c), members, label)
    found.conclude()


def _late_barrier(ctx: CheckContext, group: Any, late: int, label: str, round_: int,
                  use_async: bool) -> None:
    """``late`` enters the barrier LATE_S after the others; none may leave before it has entered."""
    key = f"barrier/{round_}/late-entered"
    early_saw_absent = True
    if ctx.rank == late:
        time.sleep(LATE_S)
        post(ctx.store, key)  # held by the store before this rank enters the barrier
    else:  # positive control: the probe (a store key) shows the late rank has not entered yet
        early_saw_absent = not ctx.store.check([key])
    if use_async:
        dist.barrier(group=group, async_op=True).wait()
    else:
        dist.barrier(group=group)
    entered = ctx.store.check([key])
    positive_control(ctx, early_saw_absent, f"{label}: rank {late} still outside the barrier when rank "
                     f"{ctx.rank} entered it (the machine was slower than the {LATE_S} s delay)")
    ctx.expect(entered, f"{label}: rank {late} had entered the barrier when rank {ctx.rank}'s "
               f"{'wait() on an async ' if use_async else ''}barrier returned", "entered", "not yet")


@check("COLL-BARRIER-BLOCKS")
def barrier_blocks(ctx: CheckContext) -> None:
    """barrier returns on no rank before the last rank has entered it (world, a subgroup, async)."""
    ctx.init_world(default_mode(ctx))
    n = ctx.world_size
    _late_barrier(ctx, None, n - 1, "world", 0, use_async=False)
    _late_barrier(ctx, None, 0, "world (async)", 1, use_async=True)
    upper = list(range(1, n)) if n > 2 else list(range(n))
    group = ctx.new_group(upper)
    if ctx.rank in upper:
        _late_barrier(ctx, group, upper[len(upper) // 2], f"subgroup {upper}", 2, use_async=False)
    dist.barrier()


def _alltoall_case(ctx: CheckContext, group: Any, members: list[int], label: str, dtype: torch.dtype,
                   uneven: bool) -> None:
    n, me = len(members), members.index(ctx.rank)

    def rows(i: int, j: int) -> int:  # rows group rank i sends to group rank j (zeros included)
        return (i + 2 * j) % 3 + (i == j) if uneven else 2

    def block(i: int, j: int) -> list[Any]:
        return ref.values(members[i], rows(i, j) * 3, dtype, salt=40 + j)

    send = [v for j in range(n) for v in block(me, j)]
    want = [v for i in range(n) for v in block(i, me)]
    inp = ref.tensor(send, dtype, ctx.device).reshape(-1, 3)
    out = torch.full((len(want) // 3, 3), 9, dtype=dtype, device=ctx.device)
    in_splits = [rows(me, j) for j in range(n)] if uneven else None
    out_splits = [rows(i, me) for i in range(n)] if uneven else None
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits, group=group)
    bad = ref.mismatch(out, want, dtype)
    ctx.expect(bad is None, f"{label}: all_to_all_single of {ref.dtype_name(dtype)}, input splits {in_splits}, "
               f"output splits {out_splits}", "each member's block for this rank, in group-rank order", bad)


@check("COLL-ALLTOALL-UNEVEN")
def alltoall_uneven(ctx: CheckContext) -> None:
    """all_to_all_single with even and uneven (zero included) split sizes delivers each block to its rank."""
    ctx.init_world("lazy")
    found = Findings(ctx)
    for label, group, members in sweep_groups(ctx):
        for dtype in (torch.float32, torch.int64):
            for uneven in (False, True):
                found.case(_alltoall_case, ctx, group, members, label, dtype, uneven)
        if label == "world" or members == list(range(1, ctx.world_size)):  # the unsorted group: hand-picked
            for plan in (cc.ALLTOALL, cc.ALLTOALL_OMITTED, cc.ALLTOALL_IDLE, cc.ARRIVAL_ALLTOALL):
                run_plan(ctx, found, plan, lambda c, g=group, m=members, lb=label:
                         cc.alltoall_case(ctx, g, m, lb, c), members, label)
    found.conclude()


@check("COLL-GRAD-TENSORS")
def grad_tensors(ctx: CheckContext) -> None:
    """Collectives and a send on nn.Parameter leaves (requires grad): exact, no autograd error, still leaves."""
    check_grad_tensors(ctx)


@check("COLL-COMPLEX")
def complex_reductions(ctx: CheckContext) -> None:
    """reduce and reduce_scatter_tensor of complex tensors: complex arithmetic, or refused naming complex."""
    ctx.init_world(default_mode(ctx))
    check_complex(ctx)
