"""Generated cases of the collective checks: the plans (dimensions and boundary values) and one runner per
family, each comparing with the exact reference of every member's seeded input (``data.py``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import cases as gc
from conformance.checks import data
from conformance.checks import reference as ref
from conformance.checks.cases import Case, Plan
from conformance.checks.common import optional_case, refused_before
from conformance.checks.generated import Declined
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

REQUIRED_OPS = ("SUM", "PRODUCT", "MIN", "MAX")
REQUIRED_DTYPES = (torch.float32, torch.float64, torch.int64)
ALIASES = {torch.bfloat16: ("bfloat16", "BFloat16"), torch.float16: ("float16", "Half"),
           torch.uint8: ("uint8", "Byte"), torch.bool: ("bool", "Bool"), torch.int64: ("int64", "Long"),
           torch.int32: ("int32", "Int"), torch.int8: ("int8", "Char"),
           torch.float32: ("float32", "Float"), torch.float64: ("float64", "Double")}
CONTIGUOUS_WORDS = ("contiguous", "Contiguous", "dense")


def applicable(op: str | None, dtype: torch.dtype) -> bool:
    """Bitwise ops on integer dtypes only; AVG on floating dtypes only (no agreed integer rounding)."""
    if op is None:
        return True
    if op in ref.BITWISE:
        return not dtype.is_floating_point
    return op != "AVG" or dtype.is_floating_point


def refusal_names(op: str | None, dtype: torch.dtype, *extra: str) -> tuple[str, ...]:
    """What a refusal of this case must name: the op, the dtype (any of its spellings), or ``extra``."""
    return (*(() if op is None else (op,)), *ALIASES.get(dtype, (ref.dtype_name(dtype),)), *extra)


REDUCING = ("all_reduce", "reduce", "reduce_scatter_tensor")


def op_matters(d: dict[str, Any]) -> bool:
    """A kind that moves data has no reduce op: its cases carry SUM as a placeholder, so that every op's
    boundary case is a reduction."""
    return d.get("kind", "all_reduce") in REDUCING or d.get("op", "SUM") == "SUM"


def _valid(d: dict[str, Any]) -> bool:
    if not gc.values_apply(d.get("values", "extremes"), d["dtype"], d["size"]):
        return False
    return op_matters(d) and applicable(d.get("op"), d["dtype"]) and gc.affordable(d["size"], d["dtype"], 8)


# The other dimensions of a boundary case are drawn from these: the ops and dtypes every backend must run,
# and no MiB size (each of those runs once, as its own boundary case: they cost the most).
CORE = {"op": ("SUM", "MAX"), "dtype": REQUIRED_DTYPES, "size": gc.sizes(big=False),
        "values": ("extremes", "full range")}  # a free value kind carries the dtype's range; "narrow" has its pairs


DTYPE_VALUES = (("dtype", "values"),)  # every dtype with every value kind: its range, extremes, high bits
KIND_VALUES = (("kind", "values"),)  # every op of a plan with every value kind ("near" ranks: a broadcast's too)


def _plan(name: str, big: bool, pairwise: tuple[tuple[Any, ...], ...] = DTYPE_VALUES,
          valid: Callable[[dict[str, Any]], bool] = _valid, **dims: tuple[Any, ...]) -> Plan:
    base = {"dtype": gc.ALL_DTYPES, "size": gc.sizes(big), "values": gc.VALUE_KINDS}
    return Plan(name, {**dims, **base}, valid=valid, samplers={"size": gc.sample_size}, core=CORE,
                pairwise=pairwise)


ALL_OPS = tuple(ref.REDUCE_OPS)
# all_reduce: every op with every dtype over the dtype's whole range (a narrow accumulator shows in SUM, a
# signedness bug in MIN/MAX: not left to whichever value kind the packing hands the pair, which may be a narrow one)
# and every dtype with every value kind
ALL_REDUCE = _plan("all_reduce", True, ((("op", "dtype"), "values", ("full range",)), *DTYPE_VALUES,
                                        ("op", "size", gc.TINY)), op=ALL_OPS, layout=gc.CONTIGUOUS_LAYOUTS)
# an input that shares its output's storage without sharing an element (both carved from one flat buffer, as a
# communication arena or a flat parameter buffer holds them): the op is out of place all the same (NCCL takes it in
# place only when sendbuff == recvbuff + rank * count), so a backend that tests the storage for in-place use leaves
# its own slot unwritten
IN_OUTPUTS_BUFFER = "in the output's buffer"


def _valid_gather(d: dict[str, Any]) -> bool:
    """all_gather's outputs are tensors of their own: an input in one buffer with them is the two tensor forms'."""
    shared = d["in_layout"] == IN_OUTPUTS_BUFFER
    return _valid(d) and (not shared or (d["kind"] != "all_gather" and d["out_layout"] == "flat"))


# each kind with every layout of its input and its output, and every dtype with every value kind
GATHER = _plan("gather/reduce_scatter", False, (("kind", "in_layout"), ("kind", "out_layout"), *DTYPE_VALUES,
                                                *KIND_VALUES, ("kind", "size", gc.TINY)), _valid_gather,
               kind=("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor"), op=ALL_OPS,
               in_layout=(*gc.CONTIGUOUS_LAYOUTS, IN_OUTPUTS_BUFFER), out_layout=gc.CONTIGUOUS_LAYOUTS)
# the same kinds in place, as FSDP calls them: all_gather_into_tensor's input is this rank's slot of the output,
# all_gather's is its own tensor of the output list, reduce_scatter_tensor's output is this rank's shard of the
# input (NCCL: in place when sendbuff == recvbuff + rank * count); a plan of its own, so GATHER's cases stay
IN_PLACE = _plan("gather/reduce_scatter in place", False, (("kind", "out_layout"), *DTYPE_VALUES,
                                                          ("kind", "size", gc.TINY)),
                 kind=("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor"), op=ALL_OPS,
                 out_layout=gc.CONTIGUOUS_LAYOUTS)
# Members that reach the call last to first (the highest global rank at once, each lower one ARRIVAL_STEP_S later):
# a backend that places a member's piece by when it arrived, not by its rank, permutes the output everywhere but on
# the last to arrive (members that call together hide it). Exact int64 data, contiguous tensors: the order is
# what is judged; a plan of its own, so GATHER's cases stay as they were.
LAST_TO_FIRST = "last to first"
ARRIVAL_STEP_S = 0.1
ARRIVAL_GATHER = Plan("gather/reduce_scatter, members arriving last to first", {
    "kind": ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor"), "op": ("SUM",),
    "dtype": (torch.int64,), "size": ("odd 3", "64KiB+1e"), "values": ("full range",), "in_layout": ("flat",),
    "out_layout": ("flat", "N-D"), "arrival": (LAST_TO_FIRST,)})
# an expanded input (stride 0: every element one memory location, as `torch.tensor(v).expand(n)` gives) only where
# the op reads it and writes elsewhere: all_reduce and broadcast write their input
# how many dimensions a tensor in each layout of NONCONTIGUOUS has: all_gather's outputs have its input's shape
# (gloo: 'invalid tensor size'), so a flat side takes the other's shape and two others must agree
LAYOUT_DIMS = {"flat": 1, "strided": 1, "expanded": 1, "transposed": 2, "channels_last": 4}
NONCONTIGUOUS = Plan("non-contiguous", {
    "kind": ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor"),
    "in_layout": ("flat", *gc.NONCONTIGUOUS_LAYOUTS, "expanded"), "out_layout": ("flat", *gc.NONCONTIGUOUS_LAYOUTS),
    "op": ("SUM", "MAX"), "dtype": (torch.float32, torch.int64, torch.bfloat16), "size": gc.sizes(big=False),
    "values": ("extremes", "full range")},
    valid=lambda d: ("flat" not in (d["in_layout"], d["out_layout"]) or d["in_layout"] != d["out_layout"])
    and (d["in_layout"] != "expanded" or d["kind"] in ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor"))
    and (d["kind"] != "all_gather" or "flat" in (d["in_layout"], d["out_layout"])
         or LAYOUT_DIMS[d["in_layout"]] == LAYOUT_DIMS[d["out_layout"]])
    and op_matters(d) and gc.affordable(d["size"], d["dtype"], 8), samplers={"size": gc.sample_size}, core=CORE,
    pairwise=(("kind", "in_layout"), ("kind", "out_layout")))
# a strided (every other element) input and output too: a backend that stages a non-contiguous output must
# copy the result back into it (or refuse it naming contiguity)
# "by sender": each member sends every member the same number of rows (its own), and passes no input split sizes
# (torch then splits its input equally, c10d checkSplitSizes) but the output ones; "by receiver" the reverse
BY_SENDER, BY_RECEIVER = "by sender, input splits omitted", "by receiver, output splits omitted"


# The shape of one row of all_to_all_single's tensors: split sizes count rows of dim 0 (an MoE layer passes
# [tokens, hidden]), so a row holds prod(row) elements
ROWS = ((), (3,), (2, 3))
ALLTOALL = _plan("all_to_all_single", False, (*DTYPE_VALUES, ("splits", "size", gc.TINY)),
                 splits=("even", "uneven", "zeros", "all to one"), row=ROWS,
                 in_layout=(*gc.CONTIGUOUS_LAYOUTS, "strided"), out_layout=(*gc.CONTIGUOUS_LAYOUTS, "strided"))
# One side's split sizes omitted, on contiguous tensors (strided ones are ALLTOALL's, with explicit splits): a plan
# of its own, so that ALLTOALL's cases stay as they were. gloo 2.13 refuses a strided tensor on one rank alone when
# split sizes are omitted ('Tensors must be contiguous'), and its peers then wait out the check's timeout (30 s at
# world size 4) or abort (world size 2): seen, each such case would cost every gloo run that long.
ALLTOALL_OMITTED = _plan("all_to_all_single, split sizes omitted", False, splits=(BY_SENDER, BY_RECEIVER), row=ROWS,
                         in_layout=gc.CONTIGUOUS_LAYOUTS, out_layout=gc.CONTIGUOUS_LAYOUTS)
# The last member sends and receives no row while the others exchange uneven blocks: its part in the collective is
# only to take part (a rank that returns at once because its share is empty leaves its peers waiting and its next
# collective paired with their this one). Contiguous tensors only: an empty tensor is contiguous whatever its strides,
# so a strided layout would put a rank that accepts beside ranks that refuse (gloo 2.13 at world size 4 then aborts).
ONE_IDLE = "last member idle"
ALLTOALL_IDLE = Plan("all_to_all_single, last member idle", {
    "splits": (ONE_IDLE,), "row": ROWS, "dtype": (torch.float32, torch.int64), "size": ("1", "odd 3", "4KiB"),
    "values": ("full range",), "in_layout": ("flat",), "out_layout": gc.CONTIGUOUS_LAYOUTS})
ARRIVAL_ALLTOALL = Plan("all_to_all_single, members arriving last to first", {
    "splits": ("uneven", "even"), "row": ((), (3,)), "dtype": (torch.int64,), "size": ("odd 3", "64KiB+1e"),
    "values": ("full range",), "in_layout": ("flat",), "out_layout": ("flat",), "arrival": (LAST_TO_FIRST,)})


def rooted_plan(n: int, big: bool) -> Plan:
    """broadcast and reduce from every group rank, named by global rank (src/dst) or group rank; each from
    every root with a size past 64 KiB too (where a backend's large-message path may handle roots its own way)."""
    return _plan(f"rooted ({n} ranks)", big, (("kind", "root"), ("kind", "root_api"), ("kind", "layout"),
                                              *DTYPE_VALUES, *KIND_VALUES, ("kind", "size", gc.TINY),
                                              (("kind", "root"), "size", ("64KiB+1e",))),
                 kind=("broadcast", "reduce"), op=ALL_OPS, root=tuple(range(n)),
                 root_api=("global", "group"), layout=gc.CONTIGUOUS_LAYOUTS)


def case_seed(ctx: CheckContext, case: Case) -> int:
    """The seed of a case's data: the run's seed, the plan and the case's index (not its shrunk dims)."""
    return gc.stable_seed(ctx.generation.seed, case.plan, case.index)


def member_inputs(ctx: CheckContext, case: Case, members: list[int], count: int, op: str | None,
                  salt: int = 0) -> dict[int, torch.Tensor]:
    """Every member's seeded input of ``count`` elements (CPU, flat)."""
    seed = gc.stable_seed(case_seed(ctx, case), salt)
    return {m: data.inputs(seed, m, case["values"], case["dtype"], op, len(members), count) for m in members}


def expected_reduction(case: Case, columns: list[torch.Tensor], op: str) -> data.Expected:
    """The exact reduction; small-integer values stay exact through every op but a rounding AVG."""
    want = data.reduce(columns, op, case["dtype"])
    n = len(columns)
    if case["values"] == "small" and not (op == "AVG" and n & (n - 1)):
        want.tolerance = None
    return want


def required_reduction(ctx: CheckContext, op: str, dtype: torch.dtype) -> bool:
    """Whether ``op`` on ``dtype`` must run: the required ops on the required dtypes, and BAND, BOR and BXOR on int64
    where the target declares ``bitwise_reductions`` (gloo runs them; NCCL has none to refuse with)."""
    declared = op in ref.BITWISE and "bitwise_reductions" in ctx.target.capabilities
    return dtype in REQUIRED_DTYPES and (op in REQUIRED_OPS or declared)


def run(ctx: CheckContext, case: Case, what: str, op: str | None, fn: Callable[[], object],
        noncontiguous: bool = False, required: bool | None = None, extra_names: tuple[str, ...] = (),
        overlapping: bool = False) -> bool:
    """Run a case's call: required cases (by default the required ops on the required dtypes, contiguous, and
    an op that moves data without reducing it, ``op`` None, on every dtype, contiguous) must run; optional ones
    may be refused naming the op, the dtype, contiguity or ``extra_names``: then ``Declined`` (run_plan re-runs
    the case with the common op and dtype).

    Moving data is copying bytes: NCCL's broadcast, all_gather, all_to_all, send and recv take every
    ncclDataType_t alike (src/collectives.cc, src/enqueue.cc: no per-dtype path), so a backend that moves one
    dtype and refuses another has a bug in its data path, not a missing feature."""
    dtype = case["dtype"]
    if dict(case.dims).get("arrival") == LAST_TO_FIRST:
        time.sleep(ARRIVAL_STEP_S * (ctx.world_size - 1 - ctx.rank))
    if required is None:
        required = (op is None or required_reduction(ctx, op, dtype)) and not noncontiguous
    if required:
        fn()
        return True
    # an overlapping (expanded) input is a layout of its own: a backend may take non-dense views and refuse it
    layout = "overlapping" if overlapping else "non-contiguous" if noncontiguous else ""
    key = f"{dict(case.dims).get('kind', case.plan)} {op} {dtype} {layout}"
    if refused_before(ctx, key):  # refused once already (and noted): every rank skips it alike
        raise Declined(key)
    names = refusal_names(op, dtype, *(CONTIGUOUS_WORDS if noncontiguous else ()), *extra_names)
    if not optional_case(ctx, what, fn, names, kind=key):
        raise Declined(key)
    return True


def expect(ctx: CheckContext, what: str, placed: data.Placed, want: data.Expected) -> None:
    """The view holds ``want``, is still the memory it was given, and nothing around it changed."""
    bad = data.mismatch(placed.view, want)
    if bad:
        raise CheckFailed(f"rank {ctx.rank}: {what}: {bad}")
    moved = placed.rebound()
    if moved:
        raise CheckFailed(f"rank {ctx.rank}: {what}: {moved}")
    damage = placed.canary_damage()
    if damage:
        raise CheckFailed(f"rank {ctx.rank}: {what}: {damage}")


def expect_kept(ctx: CheckContext, what: str, placed: data.Placed, values: torch.Tensor) -> None:
    """An out-of-place op's input still holds ``values`` (``expect``'s three checks): NCCL and gloo only read a send
    buffer (ncclAllGather, ncclReduceScatter, ncclSend take it const), and the caller may reuse it."""
    expect(ctx, f"{what}: its input after the op (an out-of-place op only reads it)", placed, data.Expected(values))


def _what(case: Case, label: str, kind: str, count: int) -> str:
    moves = kind in ("broadcast", "all_gather", "all_gather_into_tensor")
    op = f" {case['op']}" if "op" in dict(case.dims) and not moves else ""
    return f"{label}: {kind}{op} of {ref.dtype_name(case['dtype'])}[{count}] ({case['values']} values)"


def all_reduce_case(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case,
                    layout_dim: str = "layout") -> None:
    """One generated all_reduce, in place on a view in the case's layout."""
    op, dtype, n = case["op"], case["dtype"], len(members)
    count = gc.numel(case["size"], dtype, n)
    ins = member_inputs(ctx, case, members, count, op)
    layout = case[layout_dim]
    placed = data.place(ins[ctx.rank], layout, ctx.device)
    what = _what(case, label, "all_reduce", count) + f" in a {layout} tensor"
    if run(ctx, case, what, op, lambda: dist.all_reduce(placed.view, op=ref.REDUCE_OPS[op], group=group),
           noncontiguous=not placed.view.is_contiguous()):
        expect(ctx, what, placed, expected_reduction(case, [ins[m] for m in members], op))


def rooted_case(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case) -> None:
    """broadcast from / reduce to the case's root (group rank ``root``), named by global or group rank."""
    n, dtype, kind = len(members), case["dtype"], case["kind"]
    op = case["op"] if kind == "reduce" else None
    root_rank = dist.get_global_rank(group, case["root"]) if group is not None else case["root"]
    count = gc.numel(case["size"], dtype, n)
    ins = member_inputs(ctx, case, members, count, op)
    placed = data.place(ins[ctx.rank], case["layout"], ctx.device)
    by = {"src" if kind == "broadcast" else "dst": root_rank} if case["root_api"] == "global" else \
        {"group_src" if kind == "broadcast" else "group_dst": case["root"]}
    what = _what(case, label, kind, count) + f", root {case['root_api']} {next(iter(by.values()))} " \
        f"(global rank {root_rank}), {case['layout']} tensor"
    if kind == "broadcast":
        ran = run(ctx, case, what, None, lambda: dist.broadcast(placed.view, group=group, **by))
        if ran:
            expect(ctx, what, placed, data.Expected(ins[root_rank]))
        return
    ran = run(ctx, case, what, op, lambda: dist.reduce(placed.view, op=ref.REDUCE_OPS[op], group=group, **by))
    if ran and ctx.rank == root_rank:
        expect(ctx, what, placed, expected_reduction(case, [ins[m] for m in members], op))


def gather_case(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case) -> None:
    """all_gather_into_tensor, all_gather (list) or reduce_scatter_tensor; ``size`` is each member's shard."""
    n, me, dtype, kind = len(members), members.index(ctx.rank), case["dtype"], case["kind"]
    shard = gc.numel(case["size"], dtype, n) // (n if case["size"].startswith("~") else 1)  # sampled: the total
    in_layout, out_layout = case["in_layout"], case["out_layout"]
    if "N-D" in (in_layout, out_layout):  # N-D on both sides: the shard's shape, and n of them along dim 0
        in_layout = out_layout = "N-D"
    shape = data.nd_shape(shard)
    stacked = (n * shape[0], *shape[1:])  # torch's concatenation form (gloo does not take the stacked one)
    if kind == "reduce_scatter_tensor":
        op = case["op"]
        ins = member_inputs(ctx, case, members, shard * n, op)
        if in_layout == IN_OUTPUTS_BUFFER:
            out, placed_in = data.one_buffer(shard, ins[ctx.rank], ctx.device)
        else:
            out = data.empty_like_layout(shard, dtype, out_layout, ctx.device, shape)
            placed_in = data.place(ins[ctx.rank], in_layout, ctx.device, stacked)
        what = _what(case, label, kind, shard * n) + f", {in_layout} input, {out_layout} output"
        if run(ctx, case, what, op, lambda: dist.reduce_scatter_tensor(out.view, placed_in.view,
                                                                        op=ref.REDUCE_OPS[op], group=group)):
            full = expected_reduction(case, [ins[m] for m in members], op)
            part = slice(me * shard, (me + 1) * shard)
            expect(ctx, f"{what}: shard {me}", out, data.Expected(
                full.values[part], None if full.tolerance is None else full.tolerance[part]))
            expect_kept(ctx, what, placed_in, ins[ctx.rank])
        return
    ins = member_inputs(ctx, case, members, shard, None)
    want = data.Expected(torch.cat([ins[m] for m in members]))
    if in_layout == IN_OUTPUTS_BUFFER:  # all_gather_into_tensor's (_valid_gather)
        out, placed_in = data.one_buffer(shard * n, ins[ctx.rank], ctx.device)
    else:
        placed_in = data.place(ins[ctx.rank], in_layout, ctx.device, shape)
    if kind == "all_gather_into_tensor":
        if in_layout != IN_OUTPUTS_BUFFER:
            out = data.empty_like_layout(shard * n, dtype, out_layout, ctx.device, stacked)
        what = _what(case, label, kind, shard) + f", {in_layout} input, {out_layout} output"
        if run(ctx, case, what, None, lambda: dist.all_gather_into_tensor(out.view, placed_in.view, group=group)):
            expect(ctx, f"{what} in group-rank order {members}", out, want)
            expect_kept(ctx, what, placed_in, ins[ctx.rank])
        return
    outs = data.empty_slots(n, shard, dtype, out_layout, ctx.device, shape)
    what = _what(case, label, kind, shard) + f", {in_layout} input, {out_layout} outputs"
    if run(ctx, case, what, None, lambda: dist.all_gather([o.view for o in outs], placed_in.view, group=group)):
        for j, m in enumerate(members):
            expect(ctx, f"{what}: slot {j} (rank {m}'s input)", outs[j], data.Expected(ins[m]))
        expect_kept(ctx, what, placed_in, ins[ctx.rank])


def noncontiguous_case(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case) -> None:
    """A collective with a non-contiguous input and/or output view: exact, or refused naming contiguity."""
    kind = case["kind"]
    if kind == "all_reduce":
        layout = case["in_layout"] if case["in_layout"] != "flat" else case["out_layout"]
        return all_reduce_case(ctx, group, members, label, case.with_(layout=layout), layout_dim="layout")
    if kind in ("broadcast", "reduce"):
        return _noncontiguous_rooted(ctx, group, members, label, case)
    if kind == "all_gather":
        return _noncontiguous_list_gather(ctx, group, members, label, case)
    return _noncontiguous_gather(ctx, group, members, label, case)


def _noncontiguous_rooted(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case) -> None:
    """broadcast or reduce in place on a non-contiguous view, to the group's last member: the root's view holds
    the result (every member's, for broadcast)."""
    kind, n, dtype = case["kind"], len(members), case["dtype"]
    layout = case["in_layout"] if case["in_layout"] != "flat" else case["out_layout"]
    op = case["op"] if kind == "reduce" else None
    count = gc.numel(case["size"], dtype, n)
    root = members[-1]
    ins = member_inputs(ctx, case, members, count, op)
    placed = data.place(ins[ctx.rank], layout, ctx.device)
    what = _what(case, label, kind, count) + f" {'from' if op is None else 'to'} rank {root}, {layout} view"
    if op is None:
        call = lambda: dist.broadcast(placed.view, src=root, group=group)  # noqa: E731
    else:
        call = lambda: dist.reduce(placed.view, dst=root, op=ref.REDUCE_OPS[op], group=group)  # noqa: E731
    if not run(ctx, case, what, op, call, noncontiguous=True):
        return
    if op is None:
        expect(ctx, what, placed, data.Expected(ins[root]))
    elif ctx.rank == root:  # a non-root's tensor after reduce is not specified (torch's docs)
        expect(ctx, what, placed, expected_reduction(case, [ins[m] for m in members], op))


def _noncontiguous_list_gather(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case) -> None:
    """all_gather into a list of outputs in the case's output layout, from an input in its input layout."""
    n, dtype, in_layout, out_layout = len(members), case["dtype"], case["in_layout"], case["out_layout"]
    shard = gc.numel(case["size"], dtype, n)
    ins = member_inputs(ctx, case, members, shard, None)
    if in_layout == "expanded":
        ins = {m: data.first_repeated(x) for m, x in ins.items()}
    placed_in = data.place(ins[ctx.rank], in_layout, ctx.device)
    outs = [data.empty_like_layout(shard, dtype, out_layout, ctx.device) for _ in members]
    shape = outs[0].view.shape
    if placed_in.view.shape != shape:  # one side flat (the plan's rule): a view of it in the other's shape
        if in_layout == "flat":
            placed_in = data.Placed(placed_in.view.view(shape), placed_in.backing, in_layout)
        else:
            outs = [data.Placed(o.view.view(placed_in.view.shape), o.backing, out_layout) for o in outs]
    what = _what(case, label, "all_gather", shard) + f", {in_layout} input, {out_layout} outputs"
    if not run(ctx, case, what, None, lambda: dist.all_gather([o.view for o in outs], placed_in.view, group=group),
               noncontiguous=True, overlapping=in_layout == "expanded"):
        return
    for j, m in enumerate(members):
        expect(ctx, f"{what}: slot {j} (rank {m}'s input)", outs[j], data.Expected(ins[m]))
    expect_kept(ctx, what, placed_in, ins[ctx.rank][:placed_in.view.numel()])


def _noncontiguous_gather(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case) -> None:
    n, me, dtype, kind = len(members), members.index(ctx.rank), case["dtype"], case["kind"]
    shard = gc.numel(case["size"], dtype, n)
    in_layout, out_layout = case["in_layout"], case["out_layout"]
    op = case["op"] if kind == "reduce_scatter_tensor" else None
    ins = member_inputs(ctx, case, members, shard * (n if op else 1), op)
    if in_layout == "expanded":
        ins = {m: data.first_repeated(x) for m, x in ins.items()}
    placed_in = data.place(ins[ctx.rank], in_layout, ctx.device)
    out = data.empty_like_layout(shard * (1 if op else n), dtype, out_layout, ctx.device)
    what = _what(case, label, kind, shard) + f", {in_layout} input, {out_layout} output"
    if op:
        call = lambda: dist.reduce_scatter_tensor(out.view, placed_in.view, op=ref.REDUCE_OPS[op],  # noqa: E731
                                                  group=group)
    else:
        call = lambda: dist.all_gather_into_tensor(out.view, placed_in.view, group=group)  # noqa: E731
    if not run(ctx, case, what, op, call, noncontiguous=True, overlapping=in_layout == "expanded"):
        return
    if op:
        full = expected_reduction(case, [ins[m] for m in members], op)
        part = slice(me * shard, (me + 1) * shard)
        want = data.Expected(full.values[part], None if full.tolerance is None else full.tolerance[part])
    else:
        want = data.Expected(torch.cat([ins[m] for m in members]))
    expect(ctx, what, out, want)
    expect_kept(ctx, what, placed_in, ins[ctx.rank][:placed_in.view.numel()])


def _uneven_rows(i: int, j: int, n: int, unit: int) -> int:
    return unit * ((i + 2 * j) % 3) + (i == j)


# Rows group rank i sends to group rank j of n, per split pattern, given the case's unit of rows
SPLIT_ROWS: dict[str, Callable[[int, int, int, int], int]] = {
    "even": lambda i, j, n, unit: unit,
    "uneven": _uneven_rows,
    "zeros": lambda i, j, n, unit: 0 if (i + j) % 2 else unit + 1,
    "all to one": lambda i, j, n, unit: unit + 1 if j == 0 else 0,
    BY_SENDER: lambda i, j, n, unit: (unit + 1) * (i % 3),
    BY_RECEIVER: lambda i, j, n, unit: (unit + 1) * (j % 3),
    ONE_IDLE: lambda i, j, n, unit: 0 if n - 1 in (i, j) else _uneven_rows(i, j, n, unit),
}


def alltoall_case(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case) -> None:
    """all_to_all_single with the case's split pattern on tensors of rows of the case's row shape (split sizes count
    rows); ``size`` scales the rows each member sends."""
    n, me, dtype = len(members), members.index(ctx.rank), case["dtype"]
    row: tuple[int, ...] = case["row"]
    per_row = math.prod(row)
    unit = max(1, gc.numel(case["size"], dtype, n) // max(1, n * n * per_row)) if case["size"] != "0" else 0
    pattern = case["splits"]
    sends = {m: [SPLIT_ROWS[pattern](i, j, n, unit) for j in range(n)] for i, m in enumerate(members)}
    ins = member_inputs(ctx, case, members, max(sum(s) for s in sends.values()) * per_row, None)
    offsets = {m: [sum(sends[m][:j]) * per_row for j in range(n)] for m in members}
    mine = ins[ctx.rank][:sum(sends[ctx.rank]) * per_row]
    want = torch.cat([ins[m][offsets[m][me]:offsets[m][me] + sends[m][me] * per_row] for m in members])
    placed_in = data.place(mine, case["in_layout"], ctx.device)
    out = data.empty_like_layout(want.numel(), dtype, case["out_layout"], ctx.device)
    in_splits: list[int] | None = None if pattern == BY_SENDER else sends[ctx.rank]
    out_splits: list[int] | None = None if pattern == BY_RECEIVER else [sends[m][me] for m in members]
    what = (f"{label}: all_to_all_single of {ref.dtype_name(dtype)} ({case['values']} values), rows of shape "
            f"{list(row)}, {pattern} splits {in_splits} in, {out_splits} out (rows), {case['in_layout']} input, "
            f"{case['out_layout']} output")
    if run(ctx, case, what, None, lambda: dist.all_to_all_single(
            out.view.reshape(-1, *row), placed_in.view.reshape(-1, *row),
            output_split_sizes=out_splits, input_split_sizes=in_splits, group=group),
            noncontiguous="strided" in (case["in_layout"], case["out_layout"])):
        expect(ctx, what, out, data.Expected(want))
        expect_kept(ctx, what, placed_in, mine)


def in_place_case(ctx: CheckContext, group: Any, members: list[int], label: str, case: Case) -> None:
    """all_gather_into_tensor, all_gather (list) or reduce_scatter_tensor in place (``IN_PLACE``): the input is this
    rank's slot of the output (reduce_scatter_tensor: the output is this rank's shard of the input)."""
    n, me, dtype, kind, layout = len(members), members.index(ctx.rank), case["dtype"], case["kind"], case["out_layout"]
    shard = gc.numel(case["size"], dtype, n) // (n if case["size"].startswith("~") else 1)
    shape = data.nd_shape(shard)
    stacked = (n * shape[0], *shape[1:])
    rows = shape[0] if layout == "N-D" else shard

    def slot(whole: data.Placed) -> torch.Tensor:
        return whole.view.narrow(0, me * rows, rows)

    if kind == "reduce_scatter_tensor":
        op = case["op"]
        ins = member_inputs(ctx, case, members, shard * n, op)
        whole = data.place(ins[ctx.rank], layout, ctx.device, stacked)
        what = _what(case, label, kind, shard * n) + f", {layout} input, the output its shard {me}"
        mine = slot(whole)
        if run(ctx, case, what, op, lambda: dist.reduce_scatter_tensor(mine, whole.view, op=ref.REDUCE_OPS[op],
                                                                        group=group)):
            full = expected_reduction(case, [ins[m] for m in members], op)
            part = slice(me * shard, (me + 1) * shard)
            bad = data.mismatch(mine, data.Expected(full.values[part],
                                                    None if full.tolerance is None else full.tolerance[part]))
            if bad:
                raise CheckFailed(f"rank {ctx.rank}: {what}: {bad}")
        return
    ins = member_inputs(ctx, case, members, shard, None)
    if kind == "all_gather_into_tensor":
        out = data.empty_like_layout(shard * n, dtype, layout, ctx.device, stacked)
        mine = slot(out)
        mine.copy_(ins[ctx.rank].reshape(mine.shape).to(ctx.device))
        what = _what(case, label, kind, shard) + f", {layout} output, the input its slot {me}"
        if run(ctx, case, what, None, lambda: dist.all_gather_into_tensor(out.view, mine, group=group)):
            want = data.Expected(torch.cat([ins[m] for m in members]))
            expect(ctx, f"{what} in group-rank order {members}", out, want)
        return
    outs = data.empty_slots(n, shard, dtype, layout, ctx.device, shape)
    outs[me].view.copy_(ins[ctx.rank].reshape(outs[me].view.shape).to(ctx.device))
    what = _what(case, label, kind, shard) + f", {layout} outputs, the input its own slot {me}"
    if run(ctx, case, what, None, lambda: dist.all_gather([o.view for o in outs], outs[me].view, group=group)):
        for j, m in enumerate(members):
            expect(ctx, f"{what}: slot {j} (rank {m}'s input)", outs[j], data.Expected(ins[m]))
