"""Works that finished before their group was destroyed (API-LIFECYCLE): destroying the group must not change
what they report. A Work's terminal state is the op's outcome, not the group's: a backend whose teardown fails
every Work it tracks, finished ones included, tells a caller holding a finished receive that its data is bad."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from conformance.checks.common import ranked_tensor, ranked_values, work_success
from conformance.checks.reference import mismatch
from conformance.checks.registry import CheckContext

WIDTH = 4  # elements of each op's tensor


@dataclass
class Finished:
    """One finished op: what it was, its Work, the tensor it wrote and the values that tensor must hold."""

    what: str
    work: dist.Work
    tensor: torch.Tensor
    want: list[float]


def finish_works(ctx: CheckContext, group: dist.ProcessGroup, members: list[int], where: str) -> list[Finished]:
    """On ``group`` (this rank a member): an async all_reduce and, at world size 2 or more, a
    ring of isend/irecv (the first member sending first); each waited on and judged exact, its Work kept."""
    me, n = ctx.rank, len(members)
    total = ranked_tensor(ctx, WIDTH)
    done = [Finished(f"{where}: async all_reduce (SUM)", dist.all_reduce(total, group=group, async_op=True), total,
                     [sum(c) for c in zip(*(ranked_values(m, WIDTH) for m in members))])]
    if n >= 2:
        at = members.index(me)
        to, frm = members[(at + 1) % n], members[(at - 1) % n]
        got = torch.full((WIDTH,), -1.0, dtype=torch.float32, device=ctx.device)
        sent = ranked_tensor(ctx, WIDTH, salt=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the lazy-P2P warning: P2P-LAZY-WARN-ONCE's subject
            # the first member sends first, the others receive first: a ring that completes where each
            # communicator runs its P2P in order (NCCL: one stream; a receive first on every rank deadlocks)
            if me == members[0]:
                send = dist.isend(sent, dst=to, group=group)
                recv = dist.irecv(got, src=frm, group=group)
            else:
                recv = dist.irecv(got, src=frm, group=group)
                send = dist.isend(sent, dst=to, group=group)
        done += [Finished(f"{where}: irecv from rank {frm}", recv, got, ranked_values(frm, WIDTH, salt=1)),
                 Finished(f"{where}: isend to rank {to}", send, sent, ranked_values(me, WIDTH, salt=1))]
    for op in done:
        op.work.wait()
        _expect_state(ctx, op, "after wait()")
    return done


def expect_kept(ctx: CheckContext, finished: list[Finished], when: str = "after its group was destroyed") -> None:
    """After what ``when`` names (its group destroyed, a later op of its group failed): each finished Work still
    reports is_completed() True, exception() None and is_success() True (where the backend answers it), and its
    tensor holds what it did. wait() is not called again: gloo (torch 2.13.0) blocks in wait() on a finished Work
    of a destroyed group (seen on 2026-12-01)."""
    for op in finished:
        _expect_state(ctx, op, when)


def _expect_state(ctx: CheckContext, op: Finished, when: str) -> None:
    ctx.expect_equal(f"{op.what}: work.is_completed() {when}", True, op.work.is_completed())
    error = op.work.exception()
    ctx.expect(error is None, f"{op.what}: work.exception() {when}", "None", repr(error))
    ok = work_success(ctx, op.what, op.work)
    if ok is not None:
        ctx.expect_equal(f"{op.what}: work.is_success() {when}", True, ok)
    bad = mismatch(op.tensor, op.want, torch.float32)
    ctx.expect(bad is None, f"{op.what}: its tensor {when}", op.want, bad)
