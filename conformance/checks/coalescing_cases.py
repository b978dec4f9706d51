"""Generated coalesced blocks: op kind and reduce op, the number of ops, a dtype mix, sizes that differ from
op to op, and value kinds; every op of the block against its exact reference (``data.py``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import cases as gc
from conformance.checks import collective_cases as cc
from conformance.checks import data
from conformance.checks import reference as ref
from conformance.checks.cases import Case, Plan
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

MIXES: dict[str, tuple[torch.dtype, ...]] = {
    "float32": (torch.float32,), "int64": (torch.int64,), "float64": (torch.float64,),
    "bfloat16": (torch.bfloat16,), "uint8": (torch.uint8,), "float32+int64+float64":
        (torch.float32, torch.int64, torch.float64)}
BLOCK_BYTES = 256 * 1024  # a block's total size at most (time budget)


def _valid(d: dict[str, Any]) -> bool:
    dtypes = MIXES[d["dtype mix"]]
    if d["values"] == "unsigned high" and dtypes != (torch.uint8,):
        return False
    op = d["op"] if d["kind"] != "all_gather_into_tensor" else None
    if not cc.op_matters(d) or not all(cc.applicable(op, t) for t in dtypes):
        return False
    return d["count"] * gc.numel(d["size"], torch.float64, 8) * 8 <= BLOCK_BYTES


PLAN = Plan("coalesced block", {
    "kind": ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"),
    "op": ("SUM", "AVG", "PRODUCT", "MIN", "MAX"), "count": (1, 2, 9, 65, 257),
    "dtype mix": tuple(MIXES), "size": gc.sizes(big=False), "values": gc.VALUE_KINDS},
    valid=_valid, samplers={"size": gc.sample_size},
    core={"op": ("SUM", "MAX"), "dtype mix": ("float32", "int64"), "count": (1, 2, 9)},
    pairwise=(("kind", "count"), ("kind", "dtype mix")))  # each kind has its own coalesced path


def block_case(ctx: CheckContext, case: Case) -> None:
    """One block of ``count`` ops in a _coalescing_manager; op i has dtype mix[i % len] and size + i % 3."""
    n, me = ctx.world_size, ctx.rank
    world = list(range(n))
    kind, dtypes, count = case["kind"], MIXES[case["dtype mix"]], case["count"]
    op = case["op"] if kind != "all_gather_into_tensor" else None
    outs, calls, wants = [], [], []
    kept: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (op, input, its values): out-of-place inputs
    for i in range(count):
        dtype = dtypes[i % len(dtypes)]
        size = gc.numel(case["size"], dtype, n) + i % 3
        op_case = case.with_(dtype=dtype)
        if kind == "all_gather_into_tensor":
            ins = cc.member_inputs(ctx, op_case, world, size, None, salt=i)
            out = torch.full((size * n,), data.canary(dtype), dtype=dtype, device=ctx.device)
            mine = ins[me].to(ctx.device)
            kept.append((i, mine, ins[me]))
            calls.append(lambda o=out, t=mine: dist.all_gather_into_tensor(o, t))
            wants.append(data.Expected(torch.cat([ins[m] for m in world])))
        else:
            full = size * (n if kind == "reduce_scatter_tensor" else 1)
            ins = cc.member_inputs(ctx, op_case, world, full, op, salt=i)
            want = cc.expected_reduction(op_case, [ins[m] for m in world], op)
            if kind == "all_reduce":
                out = ins[me].to(ctx.device)
                calls.append(lambda o=out, p=ref.REDUCE_OPS[op]: dist.all_reduce(o, op=p))
            else:
                out = torch.full((size,), data.canary(dtype), dtype=dtype, device=ctx.device)
                mine = ins[me].to(ctx.device)
                kept.append((i, mine, ins[me]))
                calls.append(lambda o=out, t=mine, p=ref.REDUCE_OPS[op]: dist.reduce_scatter_tensor(o, t, op=p))
                part = slice(me * size, (me + 1) * size)
                want = data.Expected(want.values[part], None if want.tolerance is None else want.tolerance[part])
            wants.append(want)
        outs.append(out)

    given = [data.Placed(o, o, "flat") for o in outs]  # where each output lies, to see one pointed elsewhere

    def block() -> None:
        with dist._coalescing_manager():
            for call in calls:
                call()

    what = (f"a block of {count} {kind}{f' {op}' if op else ''} ({case['dtype mix']}, "
            f"{gc.numel(case['size'], dtypes[0], n)}+ elements each, {case['values']} values)")
    required = op in (None, "SUM", "MAX", "MIN") and dtypes in ((torch.float32,), (torch.int64,), (torch.float64,))
    if not cc.run(ctx, case.with_(dtype=dtypes[0]), what, op, block, required=required,
                  extra_names=("dtype", "type") if len(dtypes) > 1 else ()):
        return
    moved = [i for i, placed in enumerate(given) if placed.rebound()]
    if moved:
        raise CheckFailed(f"rank {me}: {what}: the outputs of ops {moved[:4]} no longer view the memory they were "
                          "given (a backend writes into the caller's tensor, never points it elsewhere)")
    bad = [(i, b) for i, (o, w) in enumerate(zip(outs, wants)) if (b := data.mismatch(o, w))]
    if bad:
        shown = "; ".join(f"op {i} ({ref.dtype_name(outs[i].dtype)}[{outs[i].numel()}]): {b}" for i, b in bad[:2])
        raise CheckFailed(f"rank {me}: {what}: {len(bad)} of {count} ops wrong: {shown}")
    changed = [(i, b) for i, t, values in kept if (b := data.mismatch(t, data.Expected(values)))]
    if changed:
        i, b = changed[0]
        raise CheckFailed(f"rank {me}: {what}: the inputs of {len(changed)} out-of-place op(s) changed (an "
                          f"all_gather or reduce_scatter only reads its input); op {i}: {b}")
