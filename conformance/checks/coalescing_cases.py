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
# but for blocks of one or two ops of one dtype of this size each: a block's total then passes 1 MiB, where a backend
# or a stack cuts a block into buckets (DDP's first bucket is 1 MiB) and the op at a bucket's edge is exposed. Not
# 4 MiB: a store-backed backend (toyccl) moves a block as one store value, and 8 MiB of it resets the TCPStore's
# connection (seen: 'DistNetworkError: Connection reset by peer')
BUCKET_EDGE = "1MiB+1e"
GAP = 3  # elements between two views of one buffer (placement "one buffer"), and before the first and after the last
PLACEMENTS = ("own tensors", "views of one buffer")


def _valid(d: dict[str, Any]) -> bool:
    dtypes = MIXES[d["dtype mix"]]
    if not all(gc.values_apply(d["values"], t, d["size"]) for t in dtypes):
        return False
    op = d["op"] if d["kind"] != "all_gather_into_tensor" else None
    if not cc.op_matters(d) or not all(cc.applicable(op, t) for t in dtypes):
        return False
    if d["size"] == BUCKET_EDGE:
        return d["count"] <= 2 and len(dtypes) == 1
    return d["count"] * gc.numel(d["size"], torch.float64, 8) * 8 <= BLOCK_BYTES


PLAN = Plan("coalesced block", {
    "kind": ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"),
    "op": ("SUM", "AVG", "PRODUCT", "MIN", "MAX"), "count": (1, 2, 9, 65, 257),
    "dtype mix": tuple(MIXES), "size": (*gc.sizes(big=False), BUCKET_EDGE), "values": gc.VALUE_KINDS,
    "placement": PLACEMENTS},
    valid=_valid, samplers={"size": gc.sample_size},
    core={"op": ("SUM", "MAX"), "dtype mix": ("float32", "int64"), "count": (1, 2, 9)},
    # each kind has its own coalesced path (the MiB sizes: one case each, Plan.alone)
    pairwise=(("kind", "count"), ("kind", "dtype mix"), ("kind", "placement"), ("kind", "size", gc.TINY)))


def _gap_values(total: int, dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Small whole numbers of this rank's own (exact in every dtype, non-negative for unsigned ones), so that a
    reduction over the ranks' gaps changes some rank's (MAX leaves only the last rank's)."""
    values = torch.arange(total) % 61 + 3 * rank
    return values % 2 == 1 if dtype == torch.bool else values.to(dtype)


class SharedBuffers:
    """The tensors of a block as views of one buffer per dtype (as a flat-parameter or bucketed buffer holds them),
    ``GAP`` elements apart; the gaps hold values of this rank's own, which no op of the block may change."""

    def __init__(self, tensors: list[torch.Tensor], rank: int) -> None:
        self.buffers: dict[torch.dtype, torch.Tensor] = {}
        self.gaps: dict[torch.dtype, torch.Tensor] = {}
        starts: list[int] = []
        ends: dict[torch.dtype, int] = {}
        for t in tensors:
            start = ends.get(t.dtype, 0) + GAP
            starts.append(start)
            ends[t.dtype] = start + t.numel()
        for dtype, end in ends.items():
            total = end + GAP
            self.buffers[dtype] = _gap_values(total, dtype, rank).to(tensors[0].device)
            self.gaps[dtype] = torch.ones(total, dtype=torch.bool)
        self.views = []
        for t, start in zip(tensors, starts, strict=True):
            view = self.buffers[t.dtype][start:start + t.numel()].view(t.shape)
            view.copy_(t)
            self.gaps[t.dtype][start:start + t.numel()] = False
            self.views.append(view)
        self._fills = {dtype: buf[self.gaps[dtype]].clone() for dtype, buf in self.buffers.items()}

    def damage(self) -> str | None:
        """None when every gap still holds its value, else where one changed."""
        for dtype, buf in self.buffers.items():
            now = buf[self.gaps[dtype]]
            changed = (now != self._fills[dtype]).nonzero().reshape(-1)
            if changed.numel():
                return (f"{changed.numel()} {ref.dtype_name(dtype)} element(s) between the views (of one buffer) the "
                        f"block was given changed; first: expected {self._fills[dtype][changed[:3]].tolist()}, "
                        f"observed {now[changed[:3]].tolist()}")
        return None


def _block_inputs(ctx: CheckContext, case: Case, fulls: list[int], dtypes: tuple[torch.dtype, ...],
                  op: str | None) -> list[tuple[dict[int, torch.Tensor], data.Expected | None]]:
    """Each op's members' inputs and, for a reduction, its expected output: one seeded draw and one reference
    per dtype of the mix, cut into the ops' pieces (a block of 257 ops at 16 ranks would otherwise draw and
    reduce 257 x 16 small tensors on every rank). An "extremes" draw puts the range's ends first, so in the
    first op of each dtype; the other ops draw from the same few extreme values."""
    world = list(range(ctx.world_size))
    pieces: list[tuple[dict[int, torch.Tensor], data.Expected | None]] = []
    drawn: dict[torch.dtype, tuple[dict[int, torch.Tensor], data.Expected | None]] = {}
    offsets: dict[torch.dtype, int] = {}
    for k, dtype in enumerate(dtypes):
        total = sum(full for i, full in enumerate(fulls) if dtypes[i % len(dtypes)] == dtype)
        dtype_case = case.with_(dtype=dtype)
        ins = cc.member_inputs(ctx, dtype_case, world, total, op, salt=k)
        drawn[dtype] = ins, (cc.expected_reduction(dtype_case, [ins[m] for m in world], op) if op else None)
    for i, full in enumerate(fulls):
        dtype = dtypes[i % len(dtypes)]
        at = offsets.get(dtype, 0)
        offsets[dtype] = at + full
        ins, want = drawn[dtype]
        cut = slice(at, at + full)
        pieces.append(({m: ins[m][cut] for m in world}, None if want is None else data.Expected(
            want.values[cut], None if want.tolerance is None else want.tolerance[cut])))
    return pieces


def block_case(ctx: CheckContext, case: Case) -> None:
    """One block of ``count`` ops in a _coalescing_manager; op i has dtype mix[i % len] and size + i % 3."""
    n, me = ctx.world_size, ctx.rank
    world = list(range(n))
    kind, dtypes, count = case["kind"], MIXES[case["dtype mix"]], case["count"]
    op = case["op"] if kind != "all_gather_into_tensor" else None
    sizes = [gc.numel(case["size"], dtypes[i % len(dtypes)], n) + i % 3 for i in range(count)]
    fulls = [size * (n if kind == "reduce_scatter_tensor" else 1) for size in sizes]
    outs, wants = [], []
    kept: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (op, input, its values): out-of-place inputs
    for i, (size, (ins, whole)) in enumerate(zip(sizes, _block_inputs(ctx, case, fulls, dtypes, op), strict=True)):
        dtype = dtypes[i % len(dtypes)]
        mine = ins[me].clone()  # a piece of this rank's drawn values: the op gets a tensor of its own
        if kind == "all_gather_into_tensor":
            out = torch.full((size * n,), data.canary(dtype), dtype=dtype, device=ctx.device)
            kept.append((i, mine.to(ctx.device), ins[me]))
            wants.append(data.Expected(torch.cat([ins[m] for m in world])))
        else:
            assert whole is not None
            want = whole
            if kind == "all_reduce":
                out = mine.to(ctx.device)
            else:
                out = torch.full((size,), data.canary(dtype), dtype=dtype, device=ctx.device)
                kept.append((i, mine.to(ctx.device), ins[me]))
                part = slice(me * size, (me + 1) * size)
                want = data.Expected(whole.values[part], None if whole.tolerance is None else whole.tolerance[part])
            wants.append(want)
        outs.append(out)

    shared = None
    if case["placement"] == PLACEMENTS[1]:  # outputs (all_reduce: in place) and inputs in one buffer
        shared = SharedBuffers(outs + [t for _, t, _ in kept], me)
        outs, placed_inputs = shared.views[:len(outs)], shared.views[len(outs):]
        kept = [(i, t, values) for (i, _, values), t in zip(kept, placed_inputs, strict=True)]
    calls = _calls(kind, outs, [t for _, t, _ in kept], op)
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
    damage = shared.damage() if shared is not None else None
    if damage:
        raise CheckFailed(f"rank {me}: {what} on views of one buffer: {damage} (a backend reads and writes only the "
                          "tensors it was given)")
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


def _calls(kind: str, outs: list[torch.Tensor], inputs: list[torch.Tensor], op: str | None) -> list[Any]:
    """The block's calls, one per op: on ``outs`` (all_reduce: in place), reading ``inputs`` (the out-of-place ops'
    inputs, in op order)."""
    if kind == "all_reduce":
        return [lambda o=o, p=ref.REDUCE_OPS[op]: dist.all_reduce(o, op=p) for o in outs]
    if kind == "all_gather_into_tensor":
        return [lambda o=o, t=t: dist.all_gather_into_tensor(o, t) for o, t in zip(outs, inputs, strict=True)]
    return [lambda o=o, t=t, p=ref.REDUCE_OPS[op]: dist.reduce_scatter_tensor(o, t, op=p)
            for o, t in zip(outs, inputs, strict=True)]
