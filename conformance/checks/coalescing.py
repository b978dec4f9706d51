"""Checks for coalescing semantics: _coalescing_manager (sync and async) and batch_isend_irecv."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import batch_cases, coalescing_cases
from conformance.checks import reference as ref
from conformance.checks.common import (
    Findings,
    default_mode,
    expect_allreduce_members,
    expect_raises,
    optional_case,
    ranked_tensor,
)
from conformance.checks.generated import run_plan
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed

N_OPS = 4
BLOCK_SIZES = (1, 2, 9, 64)
BLOCKS = (("all_reduce", "SUM"), ("all_reduce", "AVG"), ("all_reduce", "MIN"), ("all_reduce", "MAX"),
          ("all_gather_into_tensor", None), ("reduce_scatter_tensor", "SUM"), ("reduce_scatter_tensor", "MAX"))


@dataclass
class Block:
    """One coalesced block of ``count`` ops of one kind, with every rank's known inputs and the exact outputs."""

    kind: str
    op: str | None
    dtypes: tuple[torch.dtype, ...]
    outs: list[torch.Tensor]
    calls: list[Callable[[], object]]
    want: list[list[Any]]

    def what(self, i: int) -> str:
        op = f" {self.op}" if self.op else ""
        return (f"{self.kind}{op} op {i} of a block of {len(self.outs)} "
                f"({'/'.join(ref.dtype_name(d) for d in self.dtypes)}), {ref.dtype_name(self.outs[i].dtype)}"
                f"[{self.outs[i].numel()}]")


def make_block(ctx: CheckContext, kind: str, op: str | None, count: int, dtypes: tuple[torch.dtype, ...],
               salt: int) -> Block:
    """Outputs, calls and exact expectations for a block; op i has its own size and dtype (dtypes[i % len])."""
    n, me = ctx.world_size, ctx.rank
    outs, calls, want = [], [], []
    for i in range(count):
        dtype, size = dtypes[i % len(dtypes)], i % 3 + 1 + (i % 2)
        reduce_op = ref.REDUCE_OPS[op] if op else None
        if kind == "all_reduce":
            inputs = [ref.values(r, size, dtype, salt + i, op or "SUM") for r in range(n)]
            out = ref.tensor(inputs[me], dtype, ctx.device)
            calls.append(lambda o=out, p=reduce_op: dist.all_reduce(o, op=p))
            want.append(ref.combine(inputs, op or "SUM", dtype))
        elif kind == "all_gather_into_tensor":
            inputs = [ref.values(r, size, dtype, salt + i) for r in range(n)]
            out = torch.zeros(size * n, dtype=dtype, device=ctx.device)
            mine = ref.tensor(inputs[me], dtype, ctx.device)
            calls.append(lambda o=out, t=mine: dist.all_gather_into_tensor(o, t))
            want.append([v for column in inputs for v in column])
        else:
            inputs = [ref.values(r, size * n, dtype, salt + i, op or "SUM") for r in range(n)]
            out = torch.zeros(size, dtype=dtype, device=ctx.device)
            mine = ref.tensor(inputs[me], dtype, ctx.device)
            calls.append(lambda o=out, t=mine, p=reduce_op: dist.reduce_scatter_tensor(o, t, op=p))
            want.append(ref.combine(inputs, op or "SUM", dtype)[me * size:(me + 1) * size])
        outs.append(out)
    return Block(kind, op, dtypes, outs, calls, want)


def run_block(block: Block, async_ops: bool = False) -> Any:
    """Issue the block's calls inside one _coalescing_manager; return the manager (for wait())."""
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for call in block.calls:
            call()
    return cm


def expect_block(ctx: CheckContext, block: Block, found: Findings, when: str = "") -> None:
    """Every op of the block against its exact expectation."""
    for i, (out, want) in enumerate(zip(block.outs, block.want)):
        ulps = 2 if block.op == "AVG" and ctx.world_size & (ctx.world_size - 1) else 0  # AVG over 3 ranks rounds
        bad = ref.mismatch(out, want, out.dtype, ulps)
        found.case(ctx.expect, bad is None, f"{block.what(i)}{when}", "the exact result from every rank's input", bad)


# A block whose call takes over 64 KiB to describe: 256 all_gather_into_tensor of tensors of 10 elements in 63
# dimensions (torch's kernels take up to 64, and a backend may stack the ranks' tensors)
MANY_DIMS = (10,) + (1,) * 62
MANY_DIMS_OPS = 256
HELD_AFTER_S = 0.05  # when the first rank's interpreter is held, after it entered the block (time to post it)
HELD_FOR_S = 0.3  # for how long: the others enter the block, finish it and go on meanwhile
LATE_S = 0.06  # how much later than the first rank the others enter the block


@contextlib.contextmanager
def _interpreter_held(hold: bool) -> Iterator[None]:
    """While open (when ``hold``), a second thread of this rank takes the interpreter lock HELD_AFTER_S in and
    keeps it for HELD_FOR_S, running Python bytecode (as a busy data loader thread can: the switch interval is
    raised meanwhile), so that no other thread of this rank runs Python code then."""
    if not hold:
        yield
        return
    interval = sys.getswitchinterval()

    def spin() -> None:
        time.sleep(HELD_AFTER_S)
        sys.setswitchinterval(2 * HELD_FOR_S)
        until = time.monotonic() + HELD_FOR_S
        while time.monotonic() < until:
            pass
        sys.setswitchinterval(interval)

    thread = threading.Thread(target=spin, name="interpreter-held", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
        sys.setswitchinterval(interval)


def _refused_block_writes_nothing(ctx: CheckContext) -> None:
    """A block of two all_reduce BAND, an int64 tensor then a float32 one: torch's fast path makes it one
    allreduce_coalesced call with the first op's reduce op (v2.13.0 distributed_c10d.py:2898-2900, v2.15.0
    :3796-3798), and BAND has no floating meaning (torch has no float bitwise op), so the backend refuses the
    block on every rank before any data moves (gloo 2.13: 'allreduce_coalesced: tensors must all have the same
    type'; NCCL refuses BAND before it enqueues; the simulator: 'unsupported reduce op BAND'): the int64
    tensor, whose own op is valid, keeps its values as well as the float one."""
    ints = torch.tensor([6 + ctx.rank, 3 + 2 * ctx.rank, -5], dtype=torch.int64, device=ctx.device)
    floats = torch.tensor([1.5 + ctx.rank, 2.5, -0.25], device=ctx.device)
    before = [ints.tolist(), floats.tolist()]

    def block() -> None:
        with dist._coalescing_manager():
            dist.all_reduce(ints, op=dist.ReduceOp.BAND)
            dist.all_reduce(floats, op=dist.ReduceOp.BAND)

    what = "a block of all_reduce BAND of int64 then float32"
    expect_raises(ctx, what, block, (RuntimeError, ValueError, TypeError),
                  (("BAND", "type", "float", "Float", "dtype"),))
    ctx.expect(before == [ints.tolist(), floats.tolist()], f"{what}, refused: its tensors",
               f"unchanged {before}", [ints.tolist(), floats.tolist()])


def _many_dims_blocks(ctx: CheckContext, found: Findings) -> None:
    """A block whose calls take long to describe (256 all_gather_into_tensor of 10-element tensors of 63 dimensions)
    followed at once by a lone all_reduce, the last rank entering the block first and then being held (its
    interpreter busy, ``_interpreter_held``) while the others enter it, finish it and go on to the next call: a
    backend that passes call metadata through the store and drops a rank's message when that rank goes on,
    before every peer has read it, leaves the held rank waiting for it."""
    n, dtype = ctx.world_size, torch.float32
    inputs = [[ref.values(r, 10, dtype, 500 + i) for r in range(n)] for i in range(MANY_DIMS_OPS)]
    mine = [ref.tensor(columns[ctx.rank], dtype, ctx.device).reshape(MANY_DIMS) for columns in inputs]
    outs = [torch.zeros((10 * n, *MANY_DIMS[1:]), dtype=dtype, device=ctx.device) for _ in inputs]
    held = n - 1
    dist.barrier()
    if ctx.rank != held:
        time.sleep(LATE_S)
    with _interpreter_held(ctx.rank == held), dist._coalescing_manager():
        for out, t in zip(outs, mine):
            dist.all_gather_into_tensor(out, t)
    lone = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(lone)
    what = f"a block of {MANY_DIMS_OPS} all_gather_into_tensor of float32[10, 1 x 62]"
    for i, (out, columns) in enumerate(zip(outs, inputs)):
        bad = ref.mismatch(out, [v for column in columns for v in column], dtype)
        found.case(ctx.expect, bad is None, f"{what}: op {i}", "every rank's input in rank order", bad)
    found.case(ctx.expect_equal, f"{what}: the all_reduce right after it", float(n * (n + 1) // 2), lone.item())


@check("COAL-SYNC-RESULTS")
def sync_results(ctx: CheckContext) -> None:
    """A sync block gives every op's exact result: each kind and reduce op, blocks of 1, 2, 9 and 64 ops,
    mixed sizes, a block mixing dtypes (exact or refused naming the dtype), a block whose reduce op its second
    tensor's dtype cannot take (refused, none of its tensors written), and a block of 256 ops on 63-dimensional
    tensors followed at once by another call, one rank held meanwhile."""
    ctx.init_world(default_mode(ctx))
    found = Findings(ctx)
    for salt, (kind, op) in enumerate(BLOCKS):
        for count in BLOCK_SIZES:
            block = make_block(ctx, kind, op, count, (torch.float32,), salt=10 * salt + count)
            if op == "AVG":  # a backend without AVG refuses it naming the op
                if not optional_case(ctx, f"a block of {count} {kind} AVG", lambda b=block: run_block(b), ("AVG",),
                                     kind=f"{kind} AVG in a coalesced block"):
                    continue
            else:
                run_block(block)
            expect_block(ctx, block, found)
    mixed = make_block(ctx, "all_reduce", "SUM", 9, (torch.float32, torch.int64, torch.float64), salt=99)
    if optional_case(ctx, "a block of 9 all_reduce SUM mixing float32, int64 and float64", lambda: run_block(mixed),
                     ("dtype", "type")):
        expect_block(ctx, mixed, found)
    found.case(_refused_block_writes_nothing, ctx)
    _many_dims_blocks(ctx, found)
    found.checkpoint()
    world = list(range(ctx.world_size))
    run_plan(ctx, found, coalescing_cases.PLAN, lambda c: coalescing_cases.block_case(ctx, c), world, "world")
    found.conclude()


@check("COAL-SYNC-ONE-LAUNCH")
def sync_one_launch(ctx: CheckContext) -> None:
    """The backend sees one launch for a coalesced block."""
    ctx.init_world(default_mode(ctx))
    dist.barrier()
    since = ctx.probe.mark()
    run_block(make_block(ctx, "all_reduce", "SUM", N_OPS, (torch.float32,), salt=1))
    launches = ctx.probe.events("launch", since)
    ctx.expect_equal("launches for a block of 4 all_reduce", 1, len(launches))
    ctx.expect_equal("ops in that launch", N_OPS, launches[0].get("ops"))


@check("COAL-ASYNC-WAIT")
def async_wait(ctx: CheckContext) -> None:
    """cm.wait() returns only when every op of the block has completed (blocks of 2 and 9, exact results)."""
    ctx.init_world(default_mode(ctx))
    found = Findings(ctx)
    for count in (2, 9):
        block = make_block(ctx, "all_reduce", "SUM", count, (torch.float32,), salt=count)
        dist.barrier()
        if ctx.rank == 0:
            time.sleep(0.3)  # the block cannot complete before rank 0 joins: an early return shows
        run_block(block, async_ops=True).wait()
        expect_block(ctx, block, found, " right after cm.wait()")
    found.conclude()


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
    found = Findings(ctx)
    batch_cases.run_batches(ctx, found)
    found.conclude()


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
    """A block mixing SUM and MAX is refused or honours each op (exact results)."""
    ctx.init_world(default_mode(ctx))
    n = ctx.world_size
    ins = {op: [ref.values(r, 8, torch.float32, salt=i + 1, op=op) for r in range(n)]
           for i, op in enumerate(("SUM", "MAX"))}
    a, b = (ref.tensor(ins[op][ctx.rank], torch.float32, ctx.device) for op in ("SUM", "MAX"))
    try:
        with dist._coalescing_manager():
            dist.all_reduce(a, op=dist.ReduceOp.SUM)
            dist.all_reduce(b, op=dist.ReduceOp.MAX)
    except (RuntimeError, ValueError) as exc:
        ctx.note(f"mixed reduce ops refused: {exc}")
        return
    for op, got in (("SUM", a), ("MAX", b)):
        bad = ref.mismatch(got, ref.combine(ins[op], op, torch.float32), torch.float32)
        ctx.expect(bad is None, f"{op} op of a SUM+MAX block (silently run with the first op's reduce op?)",
                   "the exact result", bad)


@check("COAL-RECOVERY")
def recovery(ctx: CheckContext) -> None:
    """Empty blocks are no-ops; nested blocks work or are refused clearly; the group stays usable."""
    ctx.init_world(default_mode(ctx))
    ranks = list(range(ctx.world_size))
    with dist._coalescing_manager():
        pass
    expect_allreduce_members(ctx, dist.group.WORLD, ranks, "after an empty block")
    n = ctx.world_size
    t = ref.tensor(ref.values(ctx.rank, 8, torch.float32, salt=3), torch.float32, ctx.device)
    want = ref.combine([ref.values(r, 8, torch.float32, salt=3) for r in range(n)], "SUM", torch.float32)
    try:
        with dist._coalescing_manager(), dist._coalescing_manager():
            dist.all_reduce(t)
    except (RuntimeError, ValueError) as exc:
        ctx.note(f"nested blocks refused: {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - an unclear error class is the failure
        raise CheckFailed(f"rank {ctx.rank}: nested _coalescing_manager blocks: expected a result or a "
                          f"clear refusal, observed {type(exc).__name__}: {exc}") from None
    else:
        bad = ref.mismatch(t, want, torch.float32)
        ctx.expect(bad is None, "all_reduce inside nested blocks", "the exact sum of every rank's input", bad)
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
