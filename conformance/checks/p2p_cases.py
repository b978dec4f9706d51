"""Generated P2P cases: every rank sends to the rank ``distance`` ahead and receives from the one behind,
with the case's size (empty included), dtype, value kind, send and receive layouts, tag and source (named,
or any-source where the target has it, with the tag too)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import cases as gc
from conformance.checks import collective_cases as cc
from conformance.checks import data
from conformance.checks import reference as ref
from conformance.checks.cases import Case, Plan
from conformance.checks.generated import agree
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

CORE_DTYPES = (torch.float32, torch.float64, torch.int64)
TAGS = (0, 1, 2**31 - 1)  # c10d's tag is a C int
# Contiguous only: a refusal on one side of a non-contiguous pair would leave a message unmatched on the
# channel for the next case (the hand-picked non-contiguous exchange of P2P-DATA runs on its own).
LAYOUTS = gc.CONTIGUOUS_LAYOUTS


def plan(ctx: CheckContext) -> Plan:
    """The P2P plan for this target: any-source only where it has it."""
    sources = ("named", "any") if "p2p_any_source" in ctx.target.capabilities else ("named",)
    return Plan("p2p", {
        "distance": ("next", "previous", "opposite"), "source": sources, "tag": TAGS,
        "layout": LAYOUTS, "out_layout": LAYOUTS, "dtype": gc.ALL_DTYPES, "size": gc.sizes(),
        "values": gc.VALUE_KINDS},
        valid=lambda d: gc.values_apply(d["values"], d["dtype"], d["size"]) and gc.affordable(d["size"], d["dtype"], 8),
        samplers={"size": gc.sample_size}, core={"dtype": CORE_DTYPES, "size": gc.sizes(big=False)},
        pairwise=cc.DTYPE_VALUES)


def _step(n: int, distance: str) -> int:
    return {"next": 1, "previous": n - 1, "opposite": max(1, n // 2)}[distance]


def p2p_case(ctx: CheckContext, case: Case, group: Any = None, members: list[int] | None = None) -> None:
    """One exchange around the ring of ``members`` (global ranks, in order; default the world) on ``group`` at the
    case's distance, peers named by global rank; the received view must hold the sender's input."""
    members = members or list(range(ctx.world_size))
    n, r, dtype = len(members), ctx.rank, case["dtype"]
    step, i = _step(n, case["distance"]), members.index(ctx.rank)
    dst, src = members[(i + step) % n], members[(i - step) % n]
    count = gc.numel(case["size"], dtype, n)
    ins = cc.member_inputs(ctx, case, [r, src], count, None)
    send_layout, recv_layout = case["layout"], case["out_layout"]
    if "N-D" in (send_layout, recv_layout):  # the same shape on both sides
        send_layout = recv_layout = "N-D"
    sent = data.place(ins[r], send_layout, ctx.device)
    got = data.empty_like_layout(count, dtype, recv_layout, ctx.device)
    tag, any_source = case["tag"], case["source"] == "any"
    what = (f"rank {r} sent {ref.dtype_name(dtype)}[{count}] ({case['values']} values, {send_layout}) to rank {dst}, "
            f"received from rank {src} into a {recv_layout} view with tag {tag}"
            f"{' by any-source recv' if any_source else ''}")
    observed: list[Any] = []

    def exchange() -> None:
        work = dist.isend(sent.view, dst, group=group, tag=tag)
        if any_source:
            observed.append(dist.recv(got.view, src=None, group=group, tag=tag))
        else:
            dist.irecv(got.view, src, group=group, tag=tag).wait()
        work.wait()

    try:
        cc.run(ctx, case, what, None, exchange)
    finally:  # no rank sends the next case's message before every any-source recv of this one has matched
        if any_source:
            agree(ctx, members, f"p2p any-source {members}", "done")
    if any_source and observed[0] != src:
        raise CheckFailed(f"rank {r}: {what}: recv(src=None) reported source {observed[0]}, expected {src}")
    cc.expect(ctx, what, got, data.Expected(ins[src]))
    cc.expect_kept(ctx, f"{what}: the send buffer", sent, ins[r])
