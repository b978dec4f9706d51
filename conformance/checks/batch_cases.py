"""Generated batch_isend_irecv cases: who sends to whom (a ring, both neighbours, every peer), how many messages
each ordered pair exchanges, the order of the ops in each rank's list (sends first, receives first, alternating,
or a shuffle of the rank's own), and the size, dtype and values of the messages.

The list's order is the caller's to choose: torch hands a coalescing backend the whole list inside one
``_coalescing_manager`` and any other backend each op in turn as an isend or irecv (v2.13.0
distributed_c10d.py:3049-3068, v2.15.0 :3903-3928), and irecv only posts the receive (gloo's returns at once).
So every order completes, and the k-th receive a rank lists for a peer gets the k-th message that peer lists
for it (NCCL matches a pair's operations in order; gloo a (peer, tag) pair's in posting order). Each message
has a size of its own (``base + k % 3``) and values drawn from (sender, receiver, k), so a receive matched to
the wrong message shows.
"""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

from conformance.checks import cases as gc
from conformance.checks import collective_cases as cc
from conformance.checks import data
from conformance.checks import reference as ref
from conformance.checks.cases import Case, Plan
from conformance.checks.common import Findings
from conformance.checks.generated import run_plan
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

PATTERNS = ("ring", "both neighbours", "every peer")
ORDERS = ("sends first", "receives first", "alternating, receive first", "shuffled")
DTYPES = (torch.float32, torch.int64, torch.bfloat16, torch.uint8, torch.float64)
TAG = 5  # where the target matches tags

PLAN = Plan("batch", {
    "pattern": PATTERNS, "order": ORDERS, "repeat": (1, 2, 3), "dtype": DTYPES,
    "size": gc.sizes(big=False), "values": gc.VALUE_KINDS},
    valid=lambda d: gc.values_apply(d["values"], d["dtype"], d["size"]),
    samplers={"size": gc.sample_size}, core={"dtype": (torch.float32, torch.int64)},
    pairwise=(("pattern", "order"),))


def peers(pattern: str, rank: int, n: int) -> tuple[list[int], list[int]]:
    """(the ranks ``rank`` sends to, the ranks it receives from), once per message of one round."""
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    if pattern == "ring":
        return [nxt], [prv]
    if pattern == "both neighbours":  # at 2 ranks both are the one peer: two messages each way per round
        return [nxt, prv], [prv, nxt]
    others = [r for r in range(n) if r != rank]
    return others, others


def ordered_ops(case: Case, rank: int, n: int, seed: int) -> list[tuple[str, int, int]]:
    """``rank``'s list: (kind "send"/"recv", peer, k) where k counts that kind's earlier ops with that peer."""
    to, frm = peers(case["pattern"], rank, n)
    sends = [("send", p) for _ in range(case["repeat"]) for p in to]
    recvs = [("recv", p) for _ in range(case["repeat"]) for p in frm]
    order = case["order"]
    if order == "sends first":
        ops = sends + recvs
    elif order == "receives first":
        ops = recvs + sends
    elif order.startswith("alternating"):
        ops = [op for pair in zip(recvs, sends, strict=True) for op in pair]
    else:
        ops = sends + recvs
        random.Random(gc.stable_seed(seed, rank)).shuffle(ops)
    seen: dict[tuple[str, int], int] = {}
    out = []
    for kind, peer in ops:
        k = seen.get((kind, peer), 0)
        seen[kind, peer] = k + 1
        out.append((kind, peer, k))
    return out


def message(ctx: CheckContext, case: Case, sender: int, receiver: int, k: int) -> torch.Tensor:
    """The k-th message ``sender`` lists for ``receiver``: its own size and seeded values (CPU)."""
    count = gc.numel(case["size"], case["dtype"], ctx.world_size) + k % 3
    seed = gc.stable_seed(cc.case_seed(ctx, case), sender, receiver, k)
    return data.inputs(seed, sender, case["values"], case["dtype"], None, ctx.world_size, count)


def batch_case(ctx: CheckContext, case: Case) -> None:
    """One batch_isend_irecv on the world in this rank's order; every received tensor holds its message exactly and
    every sent tensor is unchanged."""
    n, me = ctx.world_size, ctx.rank
    tag = TAG if "p2p_tags" in ctx.target.capabilities else 0
    listed = ordered_ops(case, me, n, cc.case_seed(ctx, case))
    ops, checks = [], []
    for kind, peer, k in listed:
        if kind == "send":
            values = message(ctx, case, me, peer, k)
            tensor = values.clone().to(ctx.device)
            ops.append(dist.P2POp(dist.isend, tensor, peer, tag=tag))
            checks.append((f"send #{k} to rank {peer}", tensor, values))
        else:
            values = message(ctx, case, peer, me, k)
            tensor = torch.full((values.numel(),), data.canary(values.dtype), dtype=values.dtype, device=ctx.device)
            ops.append(dist.P2POp(dist.irecv, tensor, peer, tag=tag))
            checks.append((f"receive #{k} from rank {peer}", tensor, values))
    shown = ", ".join(f"{kind} {'to' if kind == 'send' else 'from'} {peer}" for kind, peer, _ in listed[:8])
    what = (f"rank {me}: batch_isend_irecv of {len(listed)} ops ({case['pattern']}, {case['repeat']} per pair, "
            f"{case['order']}: {shown}{', ...' if len(listed) > 8 else ''}; {ref.dtype_name(case['dtype'])}, "
            f"{gc.numel(case['size'], case['dtype'], n)}+k%3 elements, {case['values']} values, tag {tag})")

    def exchange() -> None:
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    cc.run(ctx, case, what, None, exchange)
    for label, tensor, values in checks:
        bad = data.mismatch(tensor, data.Expected(values))
        if bad:
            raise CheckFailed(f"{what}: {label}: {bad}")


def run_batches(ctx: CheckContext, found: Findings) -> None:
    """The generated batches on the world (two ranks at least)."""
    if ctx.world_size > 1:
        run_plan(ctx, found, PLAN, lambda c: batch_case(ctx, c), list(range(ctx.world_size)), "world")
