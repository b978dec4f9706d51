"""COLL-COMPLEX: reductions of complex tensors are complex arithmetic, or refused naming complex.

torch's front end turns a complex tensor into its real view (view_as_real) for the ops that only move data and for
all_reduce, refusing all_reduce with an op that has no meaning on the view (v2.13.0 distributed_c10d.py:256,
supports_complex; :3225). reduce and reduce_scatter_tensor reach the backend with the complex tensor itself
(v2.13.0 :3337, :4953 convert nothing): ProcessGroupNCCL views it as real for SUM and AVG and refuses every other op
('does not support ... on complex tensors', complexViewAsRealAllowed, ProcessGroupNCCL.cpp), as gloo does (seen,
torch 2.13.0: 'reduce does not support on complex tensors'). A backend that reduces the real view with PRODUCT, MAX or
MIN gives part-wise values with no error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.reference import mismatch
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

COMPLEX_DTYPES = (torch.complex64, torch.complex128)
EXACT = ("SUM", "AVG", "PRODUCT")  # complex arithmetic; PRODUCT may also be refused (NCCL and gloo refuse it)
UNORDERED = ("MAX", "MIN")  # no order on complex numbers: any result is wrong
REFUSAL_WORDS = ("complex",)
AVG_ULPS = 2  # AVG divides the exact sum by n once; the backend may round the division differently by an ulp
ELEMENTS = 3  # per rank and shard


def _value(rank: int, i: int) -> complex:
    """A Gaussian integer of each rank and element, small enough that products over 4 ranks stay exact."""
    return complex((rank + 1) * (i + 2) % 7 - 3, (rank + 3) * (i + 1) % 5 - 2)


def _fold(values: list[complex], op: str) -> complex:
    out = values[0]
    for v in values[1:]:
        out = out + v if op in ("SUM", "AVG") else out * v
    return out / len(values) if op == "AVG" else out


def _expect(ctx: CheckContext, what: str, got: torch.Tensor, want: list[complex], op: str) -> None:
    flat = [part for z in want for part in (z.real, z.imag)]
    real_dtype = torch.float32 if got.dtype == torch.complex64 else torch.float64
    diff = mismatch(torch.view_as_real(got), flat, real_dtype, ulps=AVG_ULPS if op == "AVG" else 0)
    ctx.expect(diff is None, what, f"{want} (complex arithmetic)", diff)


def _calls(ctx: CheckContext, dtype: torch.dtype, op: str) -> list[tuple[str, Callable[[], Any], Callable[[], None]]]:
    """(what, the call, the check of its result on this rank) for reduce to the last rank and reduce_scatter_tensor,
    each on a new group of every rank: gloo reports a refusal again at the next op of the same group."""
    n, r, dev, rop = ctx.world_size, ctx.rank, ctx.device, getattr(dist.ReduceOp, op)
    root, ranks = n - 1, list(range(n))
    reducing, scattering = ctx.new_group(ranks), ctx.new_group(ranks)
    mine = torch.tensor([_value(r, i) for i in range(ELEMENTS)], dtype=dtype, device=dev)
    reduced = [_fold([_value(k, i) for k in range(n)], op) for i in range(ELEMENTS)]
    scattered = torch.tensor([_value(r, i) for i in range(n * ELEMENTS)], dtype=dtype, device=dev)
    shard = torch.zeros(ELEMENTS, dtype=dtype, device=dev)
    my_shard = [_fold([_value(k, r * ELEMENTS + j) for k in range(n)], op) for j in range(ELEMENTS)]
    return [
        (f"reduce {op} of {dtype} to rank {root}", lambda: dist.reduce(mine, dst=root, op=rop, group=reducing),
         lambda: _expect(ctx, f"reduce {op} of {dtype}: rank {root}'s result", mine, reduced, op)
         if r == root else None),
        (f"reduce_scatter_tensor {op} of {dtype}", lambda: dist.reduce_scatter_tensor(shard, scattered, op=rop,
                                                                                          group=scattering),
         lambda: _expect(ctx, f"reduce_scatter_tensor {op} of {dtype}: this rank's shard", shard, my_shard, op)),
    ]


def _real_averages(ctx: CheckContext) -> dict[str, bool]:
    """Whether reduce and reduce_scatter_tensor run AVG of float32 here (each on a new group of every rank; a
    refusal, whatever it says, counts as not running: COLL-ALLREDUCE-OPS judges its words)."""
    n, dev, avg = ctx.world_size, ctx.device, dist.ReduceOp.AVG
    calls = {
        "reduce": lambda g: dist.reduce(torch.ones(ELEMENTS, device=dev), dst=n - 1, op=avg, group=g),
        "reduce_scatter_tensor": lambda g: dist.reduce_scatter_tensor(
            torch.zeros(ELEMENTS, device=dev), torch.ones(n * ELEMENTS, device=dev), op=avg, group=g),
    }
    ran = {}
    for kind, call in calls.items():
        try:
            call(ctx.new_group(list(range(n))))
            ran[kind] = True
        except Exception:  # noqa: BLE001 - only whether it runs matters here
            ran[kind] = False
        dist.barrier()
    return ran


def check_complex(ctx: CheckContext) -> None:
    """Every (op, reduce op, complex dtype): SUM and AVG give the complex result, PRODUCT the complex product or a
    refusal naming complex, MAX and MIN a refusal naming complex (on reduce's root; a non-root, which computes
    nothing, may return). A complex AVG refused where the same op ran complex SUM and runs float32 AVG fails: AVG is
    the sum divided by n, part by part (ProcessGroupNCCL views complex as real for both, complexViewAsRealAllowed),
    so a backend with both has no missing feature to name."""
    problems: list[str] = []
    real_avg = _real_averages(ctx)
    for dtype in COMPLEX_DTYPES:
        ran_sum: set[str] = set()
        for op in (*EXACT, *UNORDERED):
            for what, call, judge in _calls(ctx, dtype, op):
                kind = what.split(" ", 1)[0]
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - a refusal is judged by its words below
                    text = f"{type(exc).__name__}: {exc}"
                    if not any(w in text.lower() for w in REFUSAL_WORDS):
                        problems.append(f"rank {ctx.rank}: {what}: expected a result or a refusal naming "
                                        f"{list(REFUSAL_WORDS)}, observed {text.splitlines()[0][:160]}")
                    elif op == "AVG" and kind in ran_sum and real_avg[kind]:
                        problems.append(f"rank {ctx.rank}: {what}: refused ({text.splitlines()[0][:120]}), but {kind} "
                                        f"SUM of {dtype} and {kind} AVG of float32 run here: expected the complex mean")
                    elif op in ("SUM", "AVG"):
                        ctx.note(f"{what}: refused ({text.splitlines()[0][:120]}): complex {op} not supported")
                    dist.barrier()
                    continue
                if op == "SUM":
                    ran_sum.add(kind)
                if op in UNORDERED and what.startswith("reduce ") and ctx.rank != ctx.world_size - 1:
                    pass  # a non-root computes nothing here; NCCL and gloo refuse on every rank, a backend may not
                elif op in UNORDERED:
                    problems.append(f"rank {ctx.rank}: {what}: expected a refusal naming complex (complex numbers "
                                    "have no order), observed a result")
                else:
                    try:
                        judge()
                    except CheckFailed as failed:
                        problems.append(str(failed))
                dist.barrier()
    if problems:
        raise CheckFailed("; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else ""))
