"""Checks for coalescing semantics: _coalescing_manager (sync and async) and batch_isend_irecv."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from conformance.checks.common import default_mode, expect_allreduce_members, expect_raises, ranked_tensor
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed

N_OPS = 4


def _inputs(ctx: CheckContext, salt: int) -> list[torch.Tensor]:
    return [ranked_tensor(ctx, n=4 * ctx.world_size * (i + 1), salt=salt + i) for i in range(N_OPS)]


def _run(ctx: CheckContext, kind: str, inputs: list[torch.Tensor], coalesced: bool) -> list[torch.Tensor]:
    """Run N ops of ``kind`` separately or in one _coalescing_manager block; return the outputs."""
    n = ctx.world_size
    if kind == "all_reduce":
        outs = [t.clone() for t in inputs]
        calls: list[Callable[[], object]] = [lambda o=o: dist.all_reduce(o) for o in outs]
    elif kind == "all_gather_into_tensor":
        outs = [torch.zeros(t.numel() * n, device=ctx.device) for t in inputs]
        calls = [lambda o=o, t=t: dist.all_gather_into_tensor(o, t) for o, t in zip(outs, inputs)]
    else:
        outs = [torch.zeros(t.numel() // n, device=ctx.device) for t in inputs]
        calls = [lambda o=o, t=t: dist.reduce_scatter_tensor(o, t) for o, t in zip(outs, inputs)]
    if coalesced:
        with dist._coalescing_manager():
            for call in calls:
                call()
    else:
        for call in calls:
            call()
    return outs


@check("COAL-SYNC-RESULTS")
def sync_results(ctx: CheckContext) -> None:
    """A sync block gives the same results as separate calls."""
    ctx.init_world(default_mode(ctx))
    for kind in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
        inputs = _inputs(ctx, salt=len(kind))
        separate = _run(ctx, kind, inputs, coalesced=False)
        block = _run(ctx, kind, inputs, coalesced=True)
        for i, (want, got) in enumerate(zip(separate, block)):
            ctx.expect(torch.equal(want, got), f"{kind} op {i} of a coalesced block vs a separate call",
                       want[:6].tolist(), got[:6].tolist())


@check("COAL-SYNC-ONE-LAUNCH")
def sync_one_launch(ctx: CheckContext) -> None:
    """The backend sees one launch for a coalesced block."""
    ctx.init_world(default_mode(ctx))
    dist.barrier()
    since = ctx.probe.mark()
    _run(ctx, "all_reduce", _inputs(ctx, salt=1), coalesced=True)
    launches = ctx.probe.events("launch", since)
    ctx.expect_equal("launches for a block of 4 all_reduce", 1, len(launches))
    ctx.expect_equal("ops in that launch", N_OPS, launches[0].get("ops"))


@check("COAL-ASYNC-WAIT")
def async_wait(ctx: CheckContext) -> None:
    """cm.wait() returns only when every op of the block has completed."""
    ctx.init_world(default_mode(ctx))
    inputs = _inputs(ctx, salt=2)
    expected = _run(ctx, "all_reduce", inputs, coalesced=False)
    outs = [t.clone() for t in inputs]
    dist.barrier()
    if ctx.rank == 0:
        time.sleep(0.3)  # the block cannot complete before rank 0 joins: an early return shows
    with dist._coalescing_manager(async_ops=True) as cm:
        for o in outs:
            dist.all_reduce(o)
    cm.wait()
    for i, (want, got) in enumerate(zip(expected, outs)):
        ctx.expect(torch.equal(want, got), f"all_reduce op {i} of an async block right after cm.wait()",
                   want[:6].tolist(), got[:6].tolist())


@check("COAL-BATCH-WAIT")
def batch_wait(ctx: CheckContext) -> None:
    """After wait() on every batch_isend_irecv request, the received data is what was sent."""
    ctx.init_world(default_mode(ctx))
    n, r = ctx.world_size, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    big = 1 << 16
    out = torch.full((big,), float(r + 1), device=ctx.device)
    got = torch.zeros(big, device=ctx.device)
    dist.barrier()
    if r % 2 == 0:
        time.sleep(0.3)  # odd ranks post first: a wait() that does not wait returns before data exists
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prv)])
    for req in reqs:
        req.wait()
    ctx.expect_equal(f"received from rank {prv} after wait()", [float(prv + 1)] * 2,
                     [got[0].item(), got[-1].item()])


@check("COAL-BATCH-ONE-LAUNCH")
def batch_one_launch(ctx: CheckContext) -> None:
    """A batch_isend_irecv batch is one launch on a coalescing backend."""
    ctx.init_world("eager")
    n, r = ctx.world_size, ctx.rank
    dist.barrier()
    since = ctx.probe.mark()
    t, g = torch.ones(4, device=ctx.device), torch.zeros(4, device=ctx.device)
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, (r + 1) % n),
                                       dist.P2POp(dist.irecv, g, (r - 1) % n)]):
        req.wait()
    launches = ctx.probe.events("launch", since)
    ctx.expect_equal("launches for a batch of one isend and one irecv", 1, len(launches))


@check("COAL-MIXED-TYPES")
def mixed_types(ctx: CheckContext) -> None:
    """A block mixing op types is refused naming the types."""
    ctx.init_world(default_mode(ctx))
    a = ranked_tensor(ctx)
    out = torch.zeros(a.numel() * ctx.world_size, device=ctx.device)

    def block() -> None:
        with dist._coalescing_manager():
            dist.all_reduce(a)
            dist.all_gather_into_tensor(out, a)

    expect_raises(ctx, "a block of all_reduce + all_gather_into_tensor", block, (RuntimeError, ValueError),
                  ("all_reduce", "all_gather"))


@check("COAL-MIXED-REDUCEOPS")
def mixed_reduce_ops(ctx: CheckContext) -> None:
    """A block mixing SUM and MAX is refused or honours each op."""
    ctx.init_world(default_mode(ctx))
    a, b = ranked_tensor(ctx, salt=1), ranked_tensor(ctx, salt=2)
    want_a, want_b = a.clone(), b.clone()
    dist.all_reduce(want_a, op=dist.ReduceOp.SUM)
    dist.all_reduce(want_b, op=dist.ReduceOp.MAX)
    try:
        with dist._coalescing_manager():
            dist.all_reduce(a, op=dist.ReduceOp.SUM)
            dist.all_reduce(b, op=dist.ReduceOp.MAX)
    except (RuntimeError, ValueError) as exc:
        ctx.note(f"mixed reduce ops refused: {exc}")
        return
    ctx.expect(torch.equal(want_a, a), "SUM op of a SUM+MAX block", want_a[:4].tolist(), a[:4].tolist())
    ctx.expect(torch.equal(want_b, b), "MAX op of a SUM+MAX block (silently run as SUM?)",
               want_b[:4].tolist(), b[:4].tolist())


@check("COAL-RECOVERY")
def recovery(ctx: CheckContext) -> None:
    """Empty blocks are no-ops; nested blocks work or are refused clearly; the group stays usable."""
    ctx.init_world(default_mode(ctx))
    ranks = list(range(ctx.world_size))
    with dist._coalescing_manager():
        pass
    expect_allreduce_members(ctx, dist.group.WORLD, ranks, "after an empty block")
    t = ranked_tensor(ctx)
    want = t.clone()
    dist.all_reduce(want)
    try:
        with dist._coalescing_manager(), dist._coalescing_manager():
            dist.all_reduce(t)
    except (RuntimeError, ValueError) as exc:
        ctx.note(f"nested blocks refused: {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - an unclear error class is the failure
        raise CheckFailed(f"rank {ctx.rank}: nested _coalescing_manager blocks: expected a result or a "
                          f"clear refusal, observed {type(exc).__name__}: {exc}") from None
    else:
        ctx.expect(torch.equal(want, t), "all_reduce inside nested blocks", want[:4].tolist(), t[:4].tolist())
    expect_allreduce_members(ctx, dist.group.WORLD, ranks, "after nested blocks")


@check("COAL-RAISE-MIDWAY")
def raise_midway(ctx: CheckContext) -> None:
    """After an exception inside a block, the next collective runs and is right."""
    ctx.init_world(default_mode(ctx))
    t = ranked_tensor(ctx)
    try:
        with dist._coalescing_manager():
            dist.all_reduce(t.clone())
            raise KeyError("raised inside the block on purpose")
    except KeyError:
        pass
    ranks = list(range(ctx.world_size))
    expect_allreduce_members(ctx, dist.group.WORLD, ranks, "first all_reduce after the block raised")
