"""COLL-ALLREDUCE-AGREE: every member of an all_reduce holds the same bits, also where the sum is inexact.

The data checks judge floating sums against an exact reference within the tolerance model of ``data.py``, which
admits any summation order. That leaves a backend free to sum in a different order on each rank (its own input
first, say), so that ranks hold results a rounding apart: data-parallel replicas then drift apart step by step.
NCCL computes each element of the result once and copies it to every rank (ring: reduce-scatter, then
all-gather; tree: reduce to the root, then broadcast; NVLS: reduced in the switch, then multicast), and gloo's
ring does the same, so every member holds the same bits. Here the inputs are drawn so that the order matters:
values of one sign or the other over 25 binades (sums that cancel and round), and for PRODUCT factors near 1.
Each member's result must lie within the tolerance of the exact reduction, and its bits must equal every other
member's: the members' digests are compared through the store, not through the backend under test.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import data
from conformance.checks import reference as ref
from conformance.checks.cases import stable_seed
from conformance.checks.common import default_mode, optional_case, positive_control
from conformance.checks.generated import agree
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed

# (op, dtype, required): a backend must run the required ones; the others it runs or refuses naming op or dtype
CASES: tuple[tuple[str, torch.dtype, bool], ...] = (
    ("SUM", torch.float32, True), ("SUM", torch.float64, True), ("PRODUCT", torch.float32, True),
    ("AVG", torch.float32, False), ("SUM", torch.bfloat16, False), ("SUM", torch.float16, False),
)
COUNTS = (33, 70001)  # elements: a short vector, and one past the chunk sizes backends pipeline at
EXPONENTS = (-12, 12)  # binary exponents of SUM / AVG inputs: inside float16's range summed over 8 ranks
SAMPLE = 3  # elements of a rank's result named when the members disagree


def inputs(case_seed: int, rank: int, op: str, dtype: torch.dtype, count: int) -> torch.Tensor:
    """Rank ``rank``'s input: signed values over 25 binades (SUM, AVG) or factors within 1/16 of 1 (PRODUCT)."""
    g = torch.Generator().manual_seed(stable_seed(case_seed, rank))
    if op == "PRODUCT":
        return (1 + (torch.rand(count, generator=g, dtype=torch.float64) - 0.5) / 8).to(dtype)
    sign = torch.randint(0, 2, (count,), generator=g).double() * 2 - 1
    exps = torch.randint(EXPONENTS[0], EXPONENTS[1] + 1, (count,), generator=g).double()
    return (sign * (1 + torch.rand(count, generator=g, dtype=torch.float64)) * torch.exp2(exps)).to(dtype)


def digest(t: torch.Tensor) -> str:
    """The bits of ``t`` (in element order), hashed."""
    return hashlib.sha1(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


@check("COLL-ALLREDUCE-AGREE")
def allreduce_agree(ctx: CheckContext) -> None:
    """Inexact floating all_reduce on the world and (from 3 ranks) on the ranks above 0, alone and (the required
    cases) as a block of two in one _coalescing_manager: each member's result is within the tolerance of the exact
    reduction, and every member holds the same bits."""
    ctx.init_world(default_mode(ctx))
    n = ctx.world_size
    groups: list[tuple[str, Any, list[int]]] = [("world", None, list(range(n)))]
    if n >= 3:
        upper = list(range(1, n))
        sub = ctx.new_group(upper)
        if ctx.rank in upper:
            groups.append((f"group {upper}", sub, upper))
    problems: list[str] = []
    for label, group, members in groups:
        for op, dtype, required in CASES:
            blocks = [(count,) for count in COUNTS] + ([COUNTS] if required else [])
            for counts in blocks:
                problem = _case(ctx, label, group, members, op, dtype, required, counts)
                if problem:
                    problems.append(problem)
    if problems:
        raise CheckFailed(f"{len(problems)} case(s) failed: " + "; ".join(problems[:4]))
    world = groups[0][2]
    positive_control(ctx, order_matters(_seed(ctx, "world", "SUM", torch.float32, COUNTS[-1]), world),
                     "float32 sums of the world's inputs taken in two orders differ (else no order could show)")


def _seed(ctx: CheckContext, label: str, op: str, dtype: torch.dtype, count: int) -> int:
    return stable_seed(ctx.generation.seed, "agree", label, op, str(dtype), count)


def order_matters(case_seed: int, members: list[int]) -> bool:
    """Whether summing the members' float32 inputs of a case in member order and in the rotated order (the second
    member's first) gives different bits somewhere: the inputs can show a backend whose order differs by rank."""
    columns = [inputs(case_seed, m, "SUM", torch.float32, COUNTS[-1]) for m in members]
    first, rotated = columns[0].clone(), columns[1].clone()
    for c in columns[1:]:
        first += c
    for c in columns[2:] + columns[:1]:
        rotated += c
    return bool((first.view(torch.int32) != rotated.view(torch.int32)).any())


def _case(ctx: CheckContext, label: str, group: Any, members: list[int], op: str, dtype: torch.dtype,
          required: bool, counts: tuple[int, ...]) -> str | None:
    """One all_reduce per count, in one _coalescing_manager block where there are several; every member posts its
    digest whatever happened, so none waits for a member that failed."""
    block = len(counts) > 1
    what = (f"{label}: {'coalesced block of ' if block else ''}all_reduce {op} of "
            + ", ".join(f"{ref.dtype_name(dtype)}[{count}]" for count in counts))
    columns = [[inputs(_seed(ctx, label + " block" * block, op, dtype, count), m, op, dtype, count) for m in members]
               for count in counts]
    ts = [cols[members.index(ctx.rank)].clone().to(ctx.device) for cols in columns]
    problem = None
    try:
        call = functools.partial(_all_reduce, ts, op, group, block)
        if required:
            call()
            ran = True
        else:
            ran = optional_case(ctx, what, call, (op, ref.dtype_name(dtype)), kind=f"{op} {dtype}")
    except Exception as exc:  # noqa: BLE001 - named, and posted so that the members still meet
        ran, problem = False, f"rank {ctx.rank}: {what}: {type(exc).__name__}: {exc}"
    wants = [data.reduce(cols, op, dtype) for cols in columns]
    if ran and problem is None:
        for t, want, count in zip(ts, wants, counts, strict=True):
            bad = data.mismatch(t, want)
            if bad is not None:
                problem = (f"rank {ctx.rank}: {what}: the {ref.dtype_name(dtype)}[{count}]: expected the exact "
                           f"reduction within tolerance, observed {bad}")
                break
    rounded = torch.cat([want.values.to(dtype).reshape(-1) for want in wants])
    mine = torch.cat([t.detach().cpu().reshape(-1) for t in ts])
    off = (mine.double() != rounded.double()).nonzero().reshape(-1)[:SAMPLE].tolist() if ran else []
    mark = {"digest": digest(mine) if ran else "not run", "sample": {i: mine[i].item() for i in off}}
    posted = [json.loads(v) for v in agree(ctx, members, f"agree/{what}", json.dumps(mark))]
    held: dict[str, list[int]] = {}
    for member, post in zip(members, posted, strict=True):
        held.setdefault(post["digest"], []).append(member)
    if problem is None and len(held) > 1:
        samples = {m: p["sample"] for m, p in zip(members, posted, strict=True)}
        problem = (f"rank {ctx.rank}: {what}: every member holds the same bits (NCCL computes each element once and "
                   f"copies it to every rank); observed {len(held)} different results, ranks by digest {held}; "
                   f"elements that differ from the correctly rounded sum, by rank (index into the block): {samples}")
    return problem


def _all_reduce(ts: list[torch.Tensor], op: str, group: Any, block: bool) -> None:
    """all_reduce each tensor in place, inside one _coalescing_manager when ``block``."""
    with dist._coalescing_manager(group=group) if block else contextlib.nullcontext():
        for t in ts:
            dist.all_reduce(t, op=ref.REDUCE_OPS[op], group=group)
