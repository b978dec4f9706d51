"""Checks of the API surfaces around the data: Work objects and their futures, option values at the edge of
their valid range, what a non-member of a split creates, destroy and re-init, and one-member groups."""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.cases import Generation, stable_seed
from conformance.checks.common import (
    NO_OP,
    TIMEOUT_NEEDLE,
    UNSUPPORTED,
    Findings,
    default_mode,
    exit_holders,
    expect_allreduce_members,
    expect_exact,
    expect_raises,
    expect_refusal,
    new_comms,
    optional_case,
    options_part,
    positive_control,
    positive_exit_holder,
    post,
    shared_folder,
    unsorted_group,
    work_success,
)
from conformance.checks.finished_works import expect_kept, finish_works
from conformance.checks.generated import agree, raise_shared
from conformance.checks.group_program_runs import check_group_programs
from conformance.checks.hints import expect_options
from conformance.checks.option_bounds import ctas_cases
from conformance.checks.process_state import check_process_state
from conformance.checks.program_runs import check_programs
from conformance.checks.reference import mismatch
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed
from conformance.targets.base import WorldSpec
from conformance.torchcomms_hints import HINT_KEYS

MAX_TAG = 2**31 - 1
UNWAITED_POLL_S = 10.0  # how long an async all_reduce nobody waits on may take to report is_completed()
FD_DIR = "/proc/self/fd"
FD_SLACK = 1  # fds a process may hold more after two more worlds came and went (none seen)
FD_WAIT_S = 2.0  # how long the fds of destroyed worlds may take to be closed
FIRST_DESTROY_S = 5.0  # how long the other ranks hold off destroying a subgroup that rank 0 destroys first
BOOL_HINT_SPELLINGS = ("True", "FALSE")  # valid spellings of a boolean hint beyond the lower-case ones
FUTURE_WAIT_S = 2.0  # how long a completed Work's future may take to be marked done
LATE_S = 0.5  # how late (after a barrier) a peer joins where a Work must not say it is done before it
LONG_TIMEOUT = timedelta(days=1)  # a group timeout of a long job (whole days, no seconds part)
SHORT_WAIT = timedelta(milliseconds=50)  # a wait(timeout) that elapses while the op waits for its LATE_S-late peer
# what the error of that wait names: that it timed out, or the timeout it was given (toyccl: 'did not complete
# within 0:00:00.050000', str of the timedelta)
SHORT_WAIT_NAMED = (*TIMEOUT_NEEDLE, str(SHORT_WAIT), "50ms", "50 ms", "0.05 s", "0.05s")
HELD_S = 0.8  # how long a receiver holds a posted irecv before it waits on it
FROM_CALL = timedelta(seconds=0.7)  # that wait's timeout: shorter than HELD_S, longer than the message takes


def _async_cases(ctx: CheckContext) -> list[tuple[str, Callable[[], Any], torch.Tensor, list[float]]]:
    """(op, launch returning its Work, the output tensor, its exact expected value) for each async op."""
    n, r, dev = ctx.world_size, ctx.rank, ctx.device
    summed = torch.full((4,), float(r + 1), device=dev)
    rooted = torch.full((3,), float(r + 1) * 10, device=dev)
    gathered, mine = torch.zeros(2 * n, device=dev), torch.full((2,), float(r + 1), device=dev)
    shard = torch.zeros(2, device=dev)  # reduce_scatter_tensor: rank j's input holds i + j + 1 at element i
    scattered = torch.arange(2 * n, dtype=torch.float32, device=dev) + r + 1
    return [
        ("all_reduce", lambda: dist.all_reduce(summed, async_op=True), summed, [float(n * (n + 1) // 2)] * 4),
        (f"broadcast from {n - 1}", lambda: dist.broadcast(rooted, src=n - 1, async_op=True), rooted,
         [float(n) * 10] * 3),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(gathered, mine, async_op=True), gathered,
         [float(j // 2 + 1) for j in range(2 * n)]),
        # after all_gather_into_tensor: gloo's reduce_scatter_tensor work has no future at all (torch 2.13:
        # 'Work::getFuture not implemented'), a gap of the reference behind the one its waiver names
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(shard, scattered, async_op=True), shard,
         [float(n * (n + 1) // 2 + n * (2 * r + i)) for i in range(2)]),
    ]


def _expect_alias(ctx: CheckContext, op: str, carried: torch.Tensor, out: torch.Tensor, want: list[float]) -> None:
    """The future's tensor is the op's output, not a copy: c10d backends complete the future with the very
    output tensors (ProcessGroupNCCL::collective: ``work->future_->markCompleted(at::IValue(*work->outputs_))``,
    as its out-of-tree siblings XCCL, CNCL and DICL do; gloo's all_reduce and broadcast give the caller's tensor
    itself, seen). A copy costs a second buffer per op and loses in-place work done through the future (a DDP comm
    hook's ``fut.value()[0].div_(n)``): a write through it must reach the output."""
    same = carried.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    ctx.expect(same, f"{op}: get_future()'s tensor shares the output's storage (it is the output, not a copy)",
               f"storage at {out.untyped_storage().data_ptr():#x}", f"{carried.untyped_storage().data_ptr():#x}")
    plus_one = [w + 1 for w in want]
    carried.add_(1)
    bad, seen = mismatch(out, plus_one, out.dtype), out.tolist()
    carried.sub_(1)
    ctx.expect(bad is None, f"{op}: add_(1) on get_future()'s tensor, read back from the output", plus_one, seen)


def _future_tensor(value: Any) -> tuple[torch.Tensor | None, bool]:
    """The output tensor a future's value carries, and whether the value is torch's list-of-outputs form."""
    if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
        return value[0], True
    return (value, False) if isinstance(value, torch.Tensor) else (None, False)


@check("API-WORK-FUTURE")
def work_future(ctx: CheckContext) -> None:
    """An async op's Work: wait(timeout) returns True, is_completed() is then True, get_future() carries the
    op's exact output, and a callback chained on it runs once with that value (chained on a pending op's future:
    with grad mode on)."""
    before = exit_holders()  # before the world: a thread its init starts holds the exit as one an op starts does
    ctx.init_world(default_mode(ctx))
    held = _p2p_works(ctx, before)  # first: gloo's (waived) all_gather_into_tensor future stops the check below
    _barrier_future(ctx)
    for op, launch, out, want in _async_cases(ctx):
        work = launch()
        try:
            future = work.get_future()
        except RuntimeError as exc:  # gloo's reduce_scatter_tensor: 'Work::getFuture not implemented'
            raise CheckFailed(f"rank {ctx.rank}: {op}: work.get_future(): expected a future, observed "
                              f"RuntimeError: {exc}") from None
        seen: list[Any] = []
        chained = future.then(lambda f, seen=seen: seen.append(f.value()) or "ran")
        ctx.expect_equal(f"{op}: work.wait(timeout={ctx.timeout_s} s)", True,
                         work.wait(timeout=timedelta(seconds=ctx.timeout_s)))
        ctx.expect_equal(f"{op}: work.is_completed() after wait()", True, work.is_completed())
        _expect_success(ctx, op, work)
        ctx.expect_equal(f"{op}: work.wait(timeout) again, on the completed work", True,
                         work.wait(timeout=timedelta(seconds=ctx.timeout_s)))
        expect_exact(ctx, out, want, f"{op}: output after wait()")
        value = future.wait()
        carried, listed = _future_tensor(value)
        ctx.expect(carried is not None, f"{op}: get_future()'s value", "the output tensor (in a list)", value)
        # torch's DDP comm hooks read fut.value()[0] (v2.13.0 and v2.15.0 ddp_comm_hooks/default_hooks.py:31): a bare
        # tensor gives them its first row; NCCL and gloo complete the future with the list of outputs
        ctx.expect(listed, f"{op}: get_future()'s value is the list of the op's outputs (a hook reads value()[0])",
                   "[output]", f"a bare {type(value).__name__}" if not listed else value)
        ctx.expect(mismatch(carried, want, out.dtype) is None, f"{op}: the tensor get_future() carries", want,
                   carried.tolist())
        _expect_alias(ctx, op, carried, out, want)
        ctx.expect_equal(f"{op}: a callback chained with future.then()", "ran", chained.wait())
        ctx.expect_equal(f"{op}: times the callback ran", 1, len(seen))
    _works_in_flight(ctx)
    held += _zero_timeout_waits(ctx, before)
    _completes_unwaited(ctx)
    late_callbacks = _pending_callbacks(ctx)
    _call_orders(ctx)
    _timeout_from_the_call(ctx)
    _elapsed_waits(ctx)
    if held:  # judged last: a rank failing here leaves no peer waiting for it in a later op
        positive_exit_holder(ctx)
        for what, threads in held:
            _holds_no_exit(ctx, what, threads)
    if late_callbacks:  # raised at the end: the other ranks do not wait for this one in a later op
        raise CheckFailed("; ".join(late_callbacks))


def _works_in_flight(ctx: CheckContext) -> None:
    """Async ops launched one after another before any is waited on, each Work kept (DDP's buckets, FSDP's
    prefetches): then each Work's wait() returns True, its output is exact, and its future, taken at its launch and
    taken again once the last op was launched, carries its own op's output. A Work is its op's (c10d makes one per
    op): a backend that hands every op one pooled Work, its result overwritten by the next op, gives the reader of
    an earlier op the later op's tensors. reduce_scatter_tensor is left out: gloo's Work has none (see above)."""
    n = ctx.world_size
    again = torch.full((5,), float(ctx.rank + 1) * 100, device=ctx.device)
    cases = [*_async_cases(ctx)[:3], ("a second all_reduce", lambda: dist.all_reduce(again, async_op=True), again,
                                      [100.0 * (n * (n + 1) // 2)] * 5)]
    launched = []
    for op, launch, out, want in cases:
        work = launch()
        launched.append((f"{op}, launched with {len(cases) - 1} other async ops in flight", work, work.get_future(),
                         out, want))
    for what, work, _, _, _ in reversed(launched):
        ctx.expect_equal(f"{what}: work.wait(timeout)", True, work.wait(timeout=timedelta(seconds=ctx.timeout_s)))
    for what, work, at_launch, out, want in launched:
        expect_exact(ctx, out, want, f"{what}: the output")
        for taken, future in (("at its launch", at_launch), ("after the last op was launched", work.get_future())):
            _expect_carries(ctx, f"{what}: the future taken {taken}", future.wait(), want, out.dtype)


# Work calls in the orders a caller makes them: "wait" (work.wait(timeout) returns True), "poll" (is_completed()
# until True), "fresh" (a future taken now from work.get_future(), waited, carries the output), "held" (the future
# taken before the first call, read now), "then" (a callback chained on a future taken now runs once with it).
WORK_STEPS = ("wait", "poll", "fresh", "held", "then")
BOUNDARY_ORDERS: tuple[tuple[str, ...], ...] = (
    ("wait", "fresh"), ("wait", "wait", "fresh", "fresh"), ("fresh", "wait", "fresh"),
    ("poll", "fresh", "wait", "held"), ("wait", "then", "fresh"),
)
ORDER_LENGTH = 4  # steps of a drawn order


def work_orders(generation: Generation) -> list[tuple[str, ...]]:
    """The boundary orders, then ``generation.budget`` orders of ``ORDER_LENGTH`` steps drawn from its seed."""
    rng = random.Random(stable_seed("work-orders", generation.seed))
    return [*BOUNDARY_ORDERS, *(tuple(rng.choice(WORK_STEPS) for _ in range(ORDER_LENGTH))
                                for _ in range(generation.budget))]


def _call_orders(ctx: CheckContext) -> None:
    """Each async op's Work, called in each order of ``work_orders``: a future taken at any point, before or after
    wait() and however often, carries the op's exact output (c10d's Work keeps its future for its lifetime:
    ProcessGroupNCCL's WorkNCCL::getFuture returns the future_ it completes with the outputs, gloo's AsyncWork its
    future_); a backend that hands its result over at wait() leaves a later reader (DDP's comm hooks read
    get_future() after the bucket's wait) with nothing."""
    generation = Generation.from_env()
    for order in work_orders(generation):
        for op, launch, out, want in _async_cases(ctx):
            what = f"{op}, Work calls {' -> '.join(order)} (seed {generation.seed})"
            work = launch()
            held = work.get_future()
            for k, step in enumerate(order):
                _work_step(ctx, f"{what}: step {k + 1} ({step})", step, work, held, want, out.dtype)
            expect_exact(ctx, out, want, f"{what}: the output")


def _work_step(ctx: CheckContext, what: str, step: str, work: dist.Work, held: torch.futures.Future,
               want: list[float], dtype: torch.dtype) -> None:
    """One step of an order (``WORK_STEPS``); a future read must carry ``want``."""
    if step == "wait":
        ctx.expect_equal(f"{what}: work.wait(timeout)", True, work.wait(timeout=timedelta(seconds=ctx.timeout_s)))
        return
    if step == "poll":
        ctx.expect_equal(f"{what}: work.is_completed()", True,
                         _true_within(work.is_completed, min(ctx.timeout_s, UNWAITED_POLL_S)))
        return
    if step == "then":
        seen: list[Any] = []
        chained = work.get_future().then(lambda f: seen.append(f.value()) or "ran")
        ctx.expect_equal(f"{what}: the chained callback's result", "ran", chained.wait())
        ctx.expect_equal(f"{what}: times the callback ran", 1, len(seen))
        value = seen[0]
    else:
        value = (held if step == "held" else work.get_future()).wait()
    _expect_carries(ctx, f"{what}: the future's value", value, want, dtype)


def _expect_carries(ctx: CheckContext, what: str, value: Any, want: list[float], dtype: torch.dtype) -> None:
    """A future's ``value`` carries an output tensor holding ``want``."""
    carried, _ = _future_tensor(value)
    ctx.expect(carried is not None and mismatch(carried, want, dtype) is None, what, want,
               value if carried is None else carried.tolist())


def _grad_probe(weight: torch.Tensor, seen: list[tuple[bool, bool, Any]]) -> Callable[[torch.futures.Future], str]:
    """A callback that records the grad mode it runs under, whether a product of the future's tensor with
    ``weight`` (which requires grad) requires grad (what a comm hook that computes on the result needs), and the
    values the tensor holds as it runs (a future completed before the output was written shows the old ones)."""
    def callback(future: torch.futures.Future) -> str:
        carried, _ = _future_tensor(future.value())
        product = (carried.float().sum() * weight).sum() if carried is not None else None
        seen.append((torch.is_grad_enabled(), product is not None and product.requires_grad,
                     None if carried is None else carried.tolist()))
        return "ran"
    return callback


def _pending_callbacks(ctx: CheckContext) -> list[str]:
    """A callback chained on the future of a Work that is still pending (an irecv whose sender sends ``LATE_S``
    after it was posted; an async all_reduce rank 0 joins ``LATE_S`` late) runs, once the op completes, with grad
    mode on and the op's output in the future's tensor (not the buffer's old values). Grad mode is the caller's and
    a new thread's default (it is thread-local): gloo runs the callback in its worker thread, NCCL in the thread
    that marks the future done; a backend that completes the future inside its own no_grad block runs the user's
    code (DDP comm hooks, pipeline schedules computing on received tensors) without autograd. The callback's own
    record (it ran, on the op's output) is the positive control. Where the call itself waited for the late peer
    (the Work done when the callback was chained, which then runs in the caller's thread), the case is still judged
    and that is noted. Returns this rank's findings."""
    r = ctx.rank
    weight = torch.ones(1, device=ctx.device, requires_grad=True)
    problems: list[str] = []
    for op in ("irecv", "all_reduce"):
        seen: list[tuple[bool, bool, Any]] = []
        buf = torch.full((2,), 1.0, device=ctx.device)
        # the irecv's message is rank 0's 5.0s; the all_reduce sums every rank's 1.0s
        output = [5.0] * 2 if op == "irecv" else [float(ctx.world_size)] * 2
        waiting = (r == 1) if op == "irecv" else (r != 0)
        dist.barrier()  # rank 0 joins LATE_S after it, as in _zero_timeout_waits
        if waiting:
            work = dist.irecv(buf, src=0) if op == "irecv" else dist.all_reduce(buf, async_op=True)
            done_when_chained = work.is_completed()
            try:
                chained = work.get_future().then(_grad_probe(weight, seen))
            except RuntimeError as exc:  # gloo's recv Work: 'Work::getFuture not implemented' (torch 2.13, 2.15)
                if op != "irecv" or "not implemented" not in str(exc):
                    raise
                ctx.note(f"irecv: a callback on a pending receive not judged: its Work has no future ({exc})")
                work.wait()
                waiting = False
        elif r == 0:
            time.sleep(LATE_S)
            if op == "irecv":
                dist.send(torch.full((2,), 5.0, device=ctx.device), dst=1)
            else:
                dist.all_reduce(buf)
        if waiting:
            what = f"{op} whose peer joins {LATE_S} s late, a callback chained on its future"
            if done_when_chained:
                ctx.note(f"{what}: the Work was already done when the callback was chained (the call waited for "
                         "its peer): the callback ran in the caller's thread")
            if not _true_within(chained.done, LATE_S + FUTURE_WAIT_S):
                problems.append(f"rank {r}: {what}: expected it to run once the op completed, observed it had not "
                                f"run {LATE_S + FUTURE_WAIT_S} s after it was chained (the future not done on its own)")
                work.wait()  # the op itself, so that the ranks stay in step
            else:
                ran = chained.wait()
                if (ran, seen) != ("ran", [(True, True, output)]):
                    problems.append(f"rank {r}: {what}: expected it to run once with grad mode on, its product "
                                    f"with a tensor that requires grad requiring grad, and the op's output in the "
                                    f"future's tensor, [(True, True, {output})]; observed result {ran!r}, runs {seen} "
                                    "(grad mode, requires grad, the tensor's values)")
        dist.barrier()
    return problems


def _true_within(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (polled: what never happens is not waited on for good)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def _completes_unwaited(ctx: CheckContext) -> None:
    """An async all_reduce that nobody waits on reports is_completed() True once it has run (polled within the
    ``UNWAITED_POLL_S``; c10d Work::isCompleted, and ProcessGroupNCCL's WorkNCCL::isCompleted asks the op's CUDA
    event, neither needs wait()), and its output is then exact; after get_future().wait() alone it is
    completed too. A backend that sets the flag only in wait() leaves a poller (DDP's and FSDP's overlap
    logic, torch.distributed's async checkpointing) waiting forever."""
    n = ctx.world_size
    want = [float(n * (n + 1) // 2)] * 3
    t = torch.full((3,), float(ctx.rank + 1), device=ctx.device)
    work = dist.all_reduce(t, async_op=True)
    poll_s = min(ctx.timeout_s, UNWAITED_POLL_S)
    ctx.expect_equal(f"async all_reduce, never waited: work.is_completed() within {poll_s} s", True,
                     _true_within(work.is_completed, poll_s))
    expect_exact(ctx, t, want, "async all_reduce, never waited: the output once is_completed() is True")
    work.wait()
    t = torch.full((3,), float(ctx.rank + 1), device=ctx.device)
    work = dist.all_reduce(t, async_op=True)
    work.get_future().wait()
    ctx.expect_equal("async all_reduce: work.is_completed() after get_future().wait() (work.wait() not called)",
                     True, work.is_completed())
    expect_exact(ctx, t, want, "async all_reduce: the output after get_future().wait()")
    work.wait()


def _barrier_future(ctx: CheckContext) -> None:
    """barrier(async_op=True), an op with no output of the caller's: once wait() returned True, its
    get_future() is done too (within FUTURE_WAIT_S) and a callback chained on it runs once; what the future
    holds is the backend's (gloo: an empty list, NCCL: its one-element tensor)."""
    work = dist.barrier(async_op=True)
    future = work.get_future()
    seen: list[Any] = []
    chained = future.then(lambda f: seen.append(1) or "ran")
    ctx.expect_equal(f"barrier: work.wait(timeout={ctx.timeout_s} s)", True,
                     work.wait(timeout=timedelta(seconds=ctx.timeout_s)))
    _true_within(lambda: future.done() and chained.done(), FUTURE_WAIT_S)
    ctx.expect_equal(f"barrier: get_future().done() within {FUTURE_WAIT_S} s of wait() returning", True,
                     future.done())
    ctx.expect_equal("barrier: a callback chained with get_future().then() done", True, chained.done())
    ctx.expect_equal("barrier: times the callback ran", 1, len(seen))


def _expect_success(ctx: CheckContext, what: str, work: dist.Work) -> None:
    """After wait() returned, work.is_success() is True (NCCL's 'is deprecated' refusal noted: work_success)."""
    ok = work_success(ctx, what, work)
    if ok is not None:
        ctx.expect_equal(f"{what}: work.is_success() after wait()", True, ok)


Held = list[tuple[str, set[threading.Thread]]]  # (the pending op, the threads started for it that hold the exit)


def _p2p_works(ctx: CheckContext, before: set[threading.Thread]) -> Held:
    """An isend/irecv pair between the first and the last rank, the send posted ``LATE_S`` after the receive:
    the irecv's is_completed() is False at once (its message is not sent yet: a Work that says done before its
    data is there lets a poller read the buffer early), then both works succeed once waited, the data exact."""
    n, first, last = ctx.world_size, 0, ctx.world_size - 1
    dist.barrier()
    if n < 2 or ctx.rank not in (first, last):
        return []
    t = torch.full((3,), 7.0, device=ctx.device) if ctx.rank == first else torch.zeros(3, device=ctx.device)
    what = f"isend to rank {last}" if ctx.rank == first else f"irecv from rank {first}"
    if ctx.rank == first:
        time.sleep(LATE_S)
    start = time.monotonic()
    work = dist.isend(t, dst=last) if ctx.rank == first else dist.irecv(t, src=first)
    held = exit_holders() - before
    if ctx.rank == last:
        _not_done_yet(ctx, f"{what} (sent {LATE_S} s later)", work, start)
    ctx.expect_equal(f"{what}: work.wait(timeout={ctx.timeout_s} s)", True,
                     work.wait(timeout=timedelta(seconds=ctx.timeout_s)))
    _expect_success(ctx, what, work)
    expect_exact(ctx, t, [7.0] * 3, f"{what}: the tensor after wait()")
    return [(f"{what} (sent {LATE_S} s later), while pending", held)] if ctx.rank == last else []


def _not_done_yet(ctx: CheckContext, what: str, work: dist.Work, start: float) -> None:
    """An op whose peer joins ``LATE_S`` after a barrier (``start``: just after it): where the call returned well
    before then (within half of it), work.is_completed() must be False at once; a call that blocked until the
    peer came (a backend whose async ops run in the call) is noted, not judged."""
    took = time.monotonic() - start
    if took >= LATE_S / 2:
        ctx.note(f"{what}: the call returned after {took:.2f} s (it waited for the peer): is_completed() at once "
                 "not judged")
        return
    ctx.expect_equal(f"{what}: work.is_completed() at once (the call returned after {took:.2f} s)", False,
                     work.is_completed())


def _elapsed_waits(ctx: CheckContext) -> None:
    """work.wait(timeout) whose timeout elapses before the op can complete raises, reading as a timeout: on an
    all_reduce whose last rank joins ``LATE_S`` late (its other ranks wait) and an irecv on the first rank whose
    sender (the last rank) sends ``LATE_S`` late, each on a group of its own. c10d's Work::wait raises 'Operation
    timed out!' (seen on gloo's all_reduce, 2.13), gloo's recv 'Timed out waiting 50ms for recv operation to
    complete' (seen), ProcessGroupNCCL's wait with a timeout blocks the CPU, aborts the communicators and raises.
    A Work that returns instead (False, or True before the op ran) tells its caller the op is done or lets the
    timeout pass unseen. What follows differs by backend (gloo's all_reduce runs on; its recv closes the pair),
    so it is not judged: the works are waited out, bounded, with any error ignored. A
    wait that begins late (a loaded host, or a call that waited for the peer) is noted, not judged. World size 2
    or more (at 1 there is no late peer); not tried where a timed wait aborts the communicator
    (``Traits.timed_wait_aborts``: ProcessGroupNCCL)."""
    n, first, last = ctx.world_size, 0, ctx.world_size - 1
    if n < 2:  # no peer to be late
        return
    if ctx.target.traits.timed_wait_aborts:
        ctx.note("work.wait(timeout) elapsing on a pending op not tried: on this target it aborts the group's "
                 "communicator, and the late peers' ops would never complete")
        return
    found = Findings(ctx)  # judged after both, so that every rank takes every step
    for kind in ("all_reduce", "irecv"):
        group = ctx.new_group(list(range(n)), timeout_s=ctx.timeout_s)
        t = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
        dist.barrier()
        start = time.monotonic()
        if ctx.rank == last:
            time.sleep(LATE_S)
        waiter = ctx.rank != last if kind == "all_reduce" else ctx.rank == first
        what = (f"all_reduce (rank {last} joins {LATE_S} s late)" if kind == "all_reduce"
                else f"irecv from rank {last} (sent {LATE_S} s late)")
        issue = functools.partial(_late_peer_op, ctx, kind, group, t)
        work = issue() if waiter else _quietly(issue)
        if waiter and work is not None:
            found.case(_wait_elapses, ctx, f"{what}: work.wait(timeout={SHORT_WAIT.total_seconds() * 1000:.0f} ms)",
                       work, start)
        with contextlib.suppress(Exception):  # bounded: a send into a pair its receiver closed may block
            if work is not None:
                work.wait(timeout=timedelta(seconds=4 * LATE_S))
        dist.barrier()  # the world's: a gloo recv that timed out closed its pair of this group
        dist.destroy_process_group(group)
    found.conclude()


def _timeout_from_the_call(ctx: CheckContext) -> None:
    """work.wait(timeout) bounds the wait from the call, not from the op's posting (c10d's Work::wait(timeout):
    the timeout of that wait): rank 0 posts an irecv from the last rank, holds it ``HELD_S``, tells the sender
    through the store and at once waits with ``FROM_CALL``, shorter than ``HELD_S``; the sender sends when told.
    The wait returns True and the message is exact. A timeout counted from the posting elapsed before the wait
    began. World size 2 or more."""
    n, first, last = ctx.world_size, 0, ctx.world_size - 1
    if n < 2:
        return
    group = ctx.new_group(list(range(n)))
    t = torch.zeros(3, device=ctx.device)
    what = (f"irecv from rank {last} posted {HELD_S} s before its wait(timeout={FROM_CALL.total_seconds()} s), "
            "the message sent as the wait began")
    failure = None
    if ctx.rank == first:
        work = dist.irecv(t, src=last, group=group)
        time.sleep(HELD_S)
        post(ctx.store, "api-timed-wait/go")
        begun = time.monotonic()
        try:
            returned = work.wait(timeout=FROM_CALL)
        except RuntimeError as exc:
            returned = f"RuntimeError after {time.monotonic() - begun:.2f} s: {exc}"
        if returned is not True:
            failure = f"rank {first}: {what}: expected True, observed {returned!r}"
    elif ctx.rank == last:
        ctx.store.wait(["api-timed-wait/go"], timedelta(seconds=ctx.timeout_s))
        t.fill_(5.0)
        dist.send(t, first, group=group)
    raise_shared(ctx, "timed-wait-from-the-call", failure or "", first)
    if ctx.rank == first:
        expect_exact(ctx, t, [5.0] * 3, f"{what}: the tensor after wait()")


def _wait_elapses(ctx: CheckContext, what: str, work: dist.Work, start: float) -> None:
    """``work.wait(SHORT_WAIT)`` raises a RuntimeError reading as a timeout or naming the timeout it was given
    (``SHORT_WAIT_NAMED``): any return is a failure (the op waits for its peer, ``LATE_S`` after ``start``; a
    wait that returns True once the peer came waited past its timeout). Not judged where the wait begins more
    than a quarter of ``LATE_S`` after ``start`` (a loaded host, or a call that waited for the peer): noted."""
    begun = time.monotonic()
    if begun - start > LATE_S / 4:
        ctx.note(f"{what}: not judged, the wait began {begun - start:.2f} s after the op was issued")
        return
    try:
        returned = work.wait(timeout=SHORT_WAIT)
    except RuntimeError as exc:
        expect_refusal(ctx, what, exc, (SHORT_WAIT_NAMED,), (TIMEOUT_NEEDLE,))
        return
    except Exception as exc:  # noqa: BLE001 - another class is a finding
        raise CheckFailed(f"rank {ctx.rank}: {what}: expected a RuntimeError reading as a timeout, observed "
                          f"{type(exc).__name__}: {exc}") from None
    raise CheckFailed(f"rank {ctx.rank}: {what}: expected a RuntimeError reading as a timeout (the op waits for "
                      f"its peer, {LATE_S} s late), observed it returned {returned!r} after "
                      f"{time.monotonic() - begun:.2f} s")


def _late_peer_op(ctx: CheckContext, kind: str, group: Any, t: torch.Tensor) -> dist.Work | None:
    """This rank's part of ``_elapsed_waits``' op: an all_reduce on every rank; for "irecv", the first rank
    receives from the last, which sends (other ranks: nothing)."""
    first, last = 0, ctx.world_size - 1
    if kind == "all_reduce":
        return dist.all_reduce(t, group=group, async_op=True)
    if ctx.rank == first:
        return dist.irecv(t, src=last, group=group)
    return dist.isend(t, dst=first, group=group) if ctx.rank == last else None


def _quietly(call: Callable[[], dist.Work | None]) -> dist.Work | None:
    """``call()``, or None if it raised: a late peer's op after its peer's wait timed out may fail either way."""
    try:
        return call()
    except Exception:  # noqa: BLE001 - not judged: what follows a timed-out wait differs by backend
        return None


def _holds_no_exit(ctx: CheckContext, what: str, held: set[threading.Thread]) -> None:
    """While an op waited for its late peer, ``held`` were the Python threads started since the check began (by
    the world's init or by the op) that would hold the process at exit (``exit_holders``), judged at the end of
    the check so the ranks stay in step: none may be, or a program that ends with the op pending, or without
    destroy_process_group, would not exit until the thread ends (a pending op's: its timeout, 30 min by torch's
    default; a communicator's: never). The caller has shown the probe sees a thread of the check's own."""
    ctx.expect_equal(f"{what}: threads started since the check began that would hold the process at exit (alive, "
                     "not daemons)", [], sorted(t.name for t in held))


def _zero_timeout_waits(ctx: CheckContext, before: set[threading.Thread]) -> Held:
    """work.wait(timedelta(0)) means no timeout (c10d's kNoTimeout is 0 ms): on an all_reduce whose last rank
    joins ``LATE_S`` late it waits for the op and returns True, with the exact sum; before that, on the other
    ranks, is_completed() is False at once (the op cannot have run without the last rank)."""
    n = ctx.world_size
    t = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.barrier()
    if ctx.rank == n - 1:
        time.sleep(LATE_S)
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    held = exit_holders() - before
    if ctx.rank != n - 1:
        _not_done_yet(ctx, f"all_reduce (rank {n - 1} joins {LATE_S} s late)", work, start)
    ctx.expect_equal(f"all_reduce (the last rank {LATE_S} s late): work.wait(timeout=timedelta(0)), no timeout", True,
                     work.wait(timeout=timedelta(0)))
    expect_exact(ctx, t, [float(n * (n + 1) // 2)] * 4, f"all_reduce (the last rank {LATE_S} s late): output after "
                 "wait(timedelta(0))")
    return [(f"all_reduce (rank {n - 1} joins {LATE_S} s late), while pending", held)] if ctx.rank != n - 1 else []


@check("API-BOUNDARY-ACCEPTED")
def boundary_accepted(ctx: CheckContext) -> None:
    """Values at the edge of their valid range are accepted and work: P2P tags 0 and 2**31-1 between the
    group's first and last rank and, with options, the smallest and largest cga_cluster_size, min_ctas equal to
    max_ctas, every pair of 1 and 2 NCCL accepts (option_bounds) and, with hints, a boolean hint spelled in
    capitals (torchcomms lower-cases it before reading it: comms/torchcomms/utils/Utils.cpp string_to_bool)."""
    ctx.init_world(default_mode(ctx))
    first, last = 0, ctx.world_size - 1
    for tag in (0, MAX_TAG):
        t = torch.full((3,), float(tag % 1000 + 1), device=ctx.device) if ctx.rank == first else \
            torch.zeros(3, device=ctx.device)
        if ctx.rank == first:
            dist.send(t, dst=last, tag=tag)
        elif ctx.rank == last:
            dist.recv(t, src=first, tag=tag)
            expect_exact(ctx, t, [float(tag % 1000 + 1)] * 3, f"recv from rank {first} with tag {tag}")
    _long_timeout(ctx)
    if "options" in ctx.target.capabilities:
        _option_edges(ctx)
    _own_timeout(ctx)


def _option_edges(ctx: CheckContext) -> None:
    """Each valid edge of the option fields (and, with hints, of the hint values: ``hint_edges``) is accepted and
    works; a field then reaches the communicator's config with its value, and where hints and fields say the
    same (``agreeing_hints``) the effective field holds that value (a hint read as text, not parsed, shows)."""
    n = ctx.world_size
    edges: list[tuple[dict[str, Any], dict[str, Any]]] = [
        (fields, fields) for fields in ({"cga_cluster_size": 0}, {"cga_cluster_size": 8},
                                        {"min_ctas": 4, "max_ctas": 4},
                                        # one bound of a pair set alone (the other unset: NCCL's default, not 0)
                                        {"min_ctas": 2}, {"max_ctas": 2},
                                        *(case.fields for case in ctas_cases() if case.valid))]
    if "hints" in ctx.target.capabilities:
        edges += [(fields, {}) for fields in hint_edges()] + agreeing_hints()
    for fields, effective in edges:
        try:
            edged = ctx.new_group(list(range(n)), pg_options=options_part(ctx).make(**fields))
        except Exception as exc:  # noqa: BLE001 - any refusal of a valid value is the failure
            raise CheckFailed(f"rank {ctx.rank}: new_group with options {fields}: expected acceptance, "
                              f"observed {type(exc).__name__}: {exc}") from None
        expect_allreduce_members(ctx, edged, list(range(n)), f"new_group with options {fields}")
        if effective:  # a hint edge alone: accepted is the point (its effective form is the stack's)
            expect_options(ctx, edged, f"new_group with options {fields}", effective)


# minCTAs <= maxCTAs pairs whose decimal text orders the other way ('4' > '16'): valid, as numbers
TEXT_ORDERED_CTAS = ((4, 16), (9, 10), (2, 100))


def hint_edges() -> list[dict[str, Any]]:
    """Valid hint values a backend must accept: a boolean hint spelled in capitals (torchcomms lower-cases it
    before reading it: comms/torchcomms/utils/Utils.cpp string_to_bool), and minCTAs <= maxCTAs pairs whose text
    orders the other way (``TEXT_ORDERED_CTAS``), as two hints and as a field beside a hint (NCCL compares the
    numbers: src/init.cc v2.28.9:1866-1869)."""
    edges: list[dict[str, Any]] = [{"hints": {"is_high_priority_stream": spelled}} for spelled in BOOL_HINT_SPELLINGS]
    for low, high in TEXT_ORDERED_CTAS:
        edges += [{"hints": {"minCTAs": str(low), "maxCTAs": str(high)}},
                  {"min_ctas": low, "hints": {"maxCTAs": str(high)}},
                  {"max_ctas": high, "hints": {"minCTAs": str(low)}}]
    return edges


# the spellings of a boolean hint every stack reads (torchcomms' string_to_bool takes yes/no/y/n too)
BOOL_HINT_VALUES = {"true": True, "True": True, "1": True, "false": False, "FALSE": False, "0": False}


def agreeing_hints() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(options, the effective fields they must give) where a field and its hint say the same: whichever a stack
    takes (torchcomms builds its config from hints, ProcessGroupNCCL from fields), the config holds that value:
    every spelling of a boolean hint beside the field it parses to, and both CTA bounds as fields and as hints."""
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for spelled, value in BOOL_HINT_VALUES.items():
        for key in HINT_KEYS["is_high_priority_stream"]:
            fields = {"is_high_priority_stream": value}
            out.append(({**fields, "hints": {key: spelled}}, fields))
    for low, high in TEXT_ORDERED_CTAS:
        fields = {"min_ctas": low, "max_ctas": high}
        out.append(({**fields, "hints": {HINT_KEYS["min_ctas"][0]: str(low), HINT_KEYS["max_ctas"][0]: str(high)}},
                    fields))
    return out


SHORT_WORLD_S = 2.0  # the world's timeout in _own_timeout
OWN_TIMEOUT_S = 5.0  # a new_group's, longer than its world's
WELL_LATE_S = 3.3  # how late the last rank joins an all_reduce there: past the world's timeout, and its first
# rank, which receives first, still waits past the world's timeout for it
BRIEF_GROUP_S = 1.0  # a group made after that one with a shorter timeout, which must not shorten the earlier one's
# a barrier's own timeout on that group: shorter than any rank waits in the late all_reduce (the first, which
# waits least, about WELL_LATE_S less its receives), so a group that kept it fails there
BARRIER_TIMEOUT_S = 1.5
RECV_LATE_S = (0.6, 0.85)  # when two messages are sent after their receives were posted
PROMPT_S = 0.2  # how soon after its send each of those receives must complete
FRACTION_S = 0.9  # a new_group's timeout under a second, and how late its last rank joins an all_reduce there
FRACTION_LATE_S = 0.3


def _own_timeout(ctx: CheckContext) -> None:
    """On a world of timeout ``SHORT_WORLD_S``, a new_group given a longer one (``OWN_TIMEOUT_S``) waits by it, also
    after a later new_group was given a shorter one (``BRIEF_GROUP_S``). In one
    window: the first rank posts two irecvs from the last, whose messages are sent ``RECV_LATE_S`` after, and each
    must complete within ``PROMPT_S`` of its send (a receive that polls with an uncapped back-off sees a late message
    late: the two send times are apart by less than twice the first minus ``PROMPT_S`` and by more than
    ``PROMPT_S``, so a doubling back-off misses at least one); then every rank runs an all_reduce that the last
    rank joins ``WELL_LATE_S`` after the window opened (past the world's timeout on every waiting rank, and past
    the group's timeout shared among its peers on the ranks that wait from the start) and must get exact data. A
    late receive is tried once more, alone, and fails only if late in both tries (a loaded host may delay one).
    Findings are shared through the store, so every rank fails alike. Then an all_reduce whose last rank joins late
    on a new_group made without a timeout (``WELL_LATE_S`` late) and on one of timeout ``FRACTION_S``
    (``FRACTION_LATE_S`` late) gives exact data. Not tried where the check's timeout is shorter than
    ``OWN_TIMEOUT_S``."""
    if ctx.timeout_s < OWN_TIMEOUT_S:
        ctx.note(f"a group's own timeout: not tried, the check's timeout ({ctx.timeout_s} s) is under "
                 f"{OWN_TIMEOUT_S} s")
        return
    dist.barrier()
    dist.destroy_process_group()
    ctx.init_world(default_mode(ctx), timeout_s=SHORT_WORLD_S)
    n, first, last = ctx.world_size, 0, ctx.world_size - 1
    ranks = list(range(n))
    group = dist.new_group(ranks, timeout=timedelta(seconds=OWN_TIMEOUT_S))
    # a timeout belongs to its group: one made later with a shorter timeout leaves this group's alone (a backend
    # that sets it on the store every group shares gives every group the last one's)
    dist.new_group(ranks, timeout=timedelta(seconds=BRIEF_GROUP_S))
    # a new_group given no timeout (None, new_group's default) gets torch's default for its backend, filled in by the
    # front end (30 min; NCCL's 10 min: _new_group_with_tag, v2.13.0 distributed_c10d.py:5983, v2.15.0 :7190), not
    # its world's; the subject here, so not capped to the check's: the runner stops a rank that hangs in it
    unnamed = dist.new_group(ranks, timeout=None)
    fractional = dist.new_group(ranks, timeout=timedelta(seconds=FRACTION_S))
    where = (f"on a new_group of timeout {OWN_TIMEOUT_S} s (its world's: {SHORT_WORLD_S} s; a group made after it: "
             f"{BRIEF_GROUP_S} s")
    # a call's own timeout is that call's (torch passes barrier's in BarrierOptions.timeout, v2.13.0
    # distributed_c10d.py:5321-5324): a backend that keeps it as the group's gives every later op of the group that
    # one; the ranks meet through the store first, so the barrier itself waits for no one
    if "timeout" in inspect.signature(dist.barrier).parameters:
        agree(ctx, ranks, "own-timeout/barrier", "")
        finding = ""
        try:
            dist.barrier(group=group, timeout=timedelta(seconds=BARRIER_TIMEOUT_S))
        except RuntimeError as exc:
            finding = (f"rank {ctx.rank}: a barrier on a new_group of timeout {OWN_TIMEOUT_S} s given "
                       f"{BARRIER_TIMEOUT_S} s, every rank arriving together: {type(exc).__name__}: {exc}")
        wrong = [f for f in agree(ctx, ranks, "own-timeout/barrier-done", finding) if f]
        if wrong:
            raise CheckFailed("; ".join(wrong))
        where += f"; a barrier on it given {BARRIER_TIMEOUT_S} s"
    where += ")"
    agree(ctx, ranks, "own-timeout/start", "")
    received = _late_messages(ctx, group, where, 0, then_late=WELL_LATE_S) if n > 1 else None
    finding = _all_reduce_finding(ctx, group, n, 5)
    what = f"rank {ctx.rank}: all_reduce {where}, rank {last} {WELL_LATE_S} s late"
    wrong = [f for f in agree(ctx, ranks, "own-timeout/late-peer", f"{what}: {finding}" if finding else "") if f]
    if wrong:
        raise CheckFailed("; ".join(wrong))
    # torch gave the group its backend's default timeout (minutes): a backend that takes the world's for it (the
    # default read as 'unset') fails
    _late_peer_all_reduce(ctx, unnamed, ranks, WELL_LATE_S, "a new_group made without a timeout (torch's default for "
                          f"its backend) in a world of timeout {SHORT_WORLD_S} s")
    # a timeout under a second: a backend that keeps whole seconds of it (int(total_seconds())) waits 0 s
    _late_peer_all_reduce(ctx, fractional, ranks, FRACTION_LATE_S, f"a new_group of timeout {FRACTION_S} s")
    first_try = agree(ctx, ranks, "own-timeout/receives", received or "")[first]
    if first_try:
        again = agree(ctx, ranks, "own-timeout/receives", _late_messages(ctx, group, where, 1) or "")[first]
        if again:
            raise CheckFailed(f"in both of two tries: {first_try}; then {again}")


def _all_reduce_finding(ctx: CheckContext, group: dist.ProcessGroup, n: int, numel: int) -> str:
    """An all_reduce SUM on ``group`` of ``numel`` elements holding rank + 1: '' when every element is the sum over
    its ``n`` ranks, else what was observed instead (the values, or the error and after how long it came)."""
    t = torch.full((numel,), float(ctx.rank + 1), device=ctx.device)
    want = [float(n * (n + 1) // 2)] * numel
    begun = time.monotonic()
    try:
        dist.all_reduce(t, group=group)
    except RuntimeError as exc:
        return f"expected {want}, observed after {time.monotonic() - begun:.1f} s {type(exc).__name__}: {exc}"
    return "" if mismatch(t, want, t.dtype) is None else f"expected {want}, observed {t.tolist()}"


def _late_peer_all_reduce(ctx: CheckContext, group: dist.ProcessGroup, ranks: list[int], late_s: float,
                          label: str) -> None:
    """An all_reduce on ``group`` (``label`` says how it was made) whose last rank joins ``late_s`` after the others
    gives exact data on every rank; findings are shared through the store, so every rank fails alike."""
    n, last = len(ranks), ranks[-1]
    agree(ctx, ranks, f"own-timeout/{label}", "")
    if ctx.rank == last:
        time.sleep(late_s)
    finding = _all_reduce_finding(ctx, group, n, 3)
    what = f"rank {ctx.rank}: all_reduce on {label}, rank {last} {late_s} s late"
    wrong = [f for f in agree(ctx, ranks, f"own-timeout/{label}/done", f"{what}: {finding}" if finding else "") if f]
    if wrong:
        raise CheckFailed("; ".join(wrong))


def _late_messages(ctx: CheckContext, group: dist.ProcessGroup, where: str, attempt: int,
                   then_late: float = 0.0) -> str | None:
    """Rank 0 posts two irecvs from the last rank, which sends at ``RECV_LATE_S`` after the posting (told through
    the store, with its send times) and then sleeps until ``then_late`` after it; each receive must complete,
    exact, within ``PROMPT_S`` of its send. Rank 0's finding, else None."""
    first, last = 0, ctx.world_size - 1
    key = f"own-timeout/{attempt}"
    if ctx.rank == last:
        ctx.store.wait([f"{key}/posted"], timedelta(seconds=ctx.timeout_s))
        start = time.monotonic()
        for k, late in enumerate(RECV_LATE_S):
            time.sleep(max(0.0, start + late - time.monotonic()))
            post(ctx.store, f"{key}/sent{k}", repr(time.time()).encode())
            dist.send(torch.full((3,), float(k + 7), device=ctx.device), first, group=group)
        time.sleep(max(0.0, start + then_late - time.monotonic()))
        return None
    if ctx.rank != first:
        return None
    bufs = [torch.zeros(3, device=ctx.device) for _ in RECV_LATE_S]
    works = [dist.irecv(b, src=last, group=group) for b in bufs]
    post(ctx.store, f"{key}/posted")
    for k, (work, buf) in enumerate(zip(works, bufs, strict=True)):
        what = f"irecv #{k + 1} from rank {last} {where}, sent {RECV_LATE_S[k]} s after it was posted"
        try:
            work.wait()
            if buf.is_cuda:
                torch.cuda.synchronize(buf.device)
        except RuntimeError as exc:
            return f"rank {first}: {what}: expected its message, observed {type(exc).__name__}: {exc}"
        done = time.time()
        ctx.store.wait([f"{key}/sent{k}"], timedelta(seconds=ctx.timeout_s))
        lag = done - float(ctx.store.get(f"{key}/sent{k}").decode())
        if lag > PROMPT_S or mismatch(buf, [float(k + 7)] * 3, buf.dtype) is not None:
            return (f"rank {first}: {what}: expected {[float(k + 7)] * 3} within {PROMPT_S} s of the send, observed "
                    f"{buf.tolist()} {lag:.2f} s after it")
    return None


def _long_timeout(ctx: CheckContext) -> None:
    """A group made with a timeout of ``LONG_TIMEOUT`` (a valid value: long jobs set hours or days) works where a
    wait is needed: an all_reduce whose last rank joins ``LATE_S`` late, and a recv by the last rank from the
    first, which sends ``LATE_S`` late, give exact data (a backend that reads the timeout's seconds field only
    waits 0 s). The group's timeout is the subject, so it is not capped to the check's (``ctx.new_group``): a
    backend that hangs here is stopped by the runner, naming the hung rank."""
    n, first, last = ctx.world_size, 0, ctx.world_size - 1
    group = dist.new_group(list(range(n)), timeout=LONG_TIMEOUT)
    what = f"on a group with timeout {LONG_TIMEOUT}"
    t = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.barrier()
    if ctx.rank == last:
        time.sleep(LATE_S)
    dist.all_reduce(t, group=group)
    expect_exact(ctx, t, [float(n * (n + 1) // 2)] * 4, f"all_reduce {what}, rank {last} {LATE_S} s late")
    if n < 2 or ctx.rank not in (first, last):
        return
    t = torch.full((3,), 5.0, device=ctx.device) if ctx.rank == first else torch.zeros(3, device=ctx.device)
    if ctx.rank == first:
        time.sleep(LATE_S)
        dist.send(t, dst=last, group=group)
    else:
        dist.recv(t, src=first, group=group)
        expect_exact(ctx, t, [5.0] * 3, f"recv from rank {first} {what}, sent {LATE_S} s late")


@check("API-NONMEMBER-CREATES-NOTHING")
def nonmember_creates_nothing(ctx: CheckContext) -> None:
    """A rank outside every group of a split, or outside a new_group, creates no communicator (the same rank
    first shows, as a member of a split, that the probe sees one being made)."""
    ctx.init_world("eager")
    n = ctx.world_size
    since = ctx.probe.mark()
    dist.split_group(split_ranks=[list(range(n))])
    positive_control(ctx, bool(new_comms(ctx, since)), "a communicator made by a split this rank is a member of")
    for members in ([0], list(range(1, n))):
        since = ctx.probe.mark()
        child = dist.split_group(split_ranks=[members])
        sub = ctx.new_group(members)
        made = new_comms(ctx, since)
        if ctx.rank in members:
            expect_allreduce_members(ctx, child, members, f"split {members}")
            expect_allreduce_members(ctx, sub, members, f"new_group {members}")
        else:
            ctx.expect(not made, f"communicators made on non-member rank {ctx.rank} by split_group and "
                       f"new_group of {members}", "none", made)
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(n)), "world after the splits")


@check("API-LIFECYCLE")
def lifecycle(ctx: CheckContext) -> None:
    """Destroying one subgroup leaves the world and another subgroup working; destroy_process_group() then
    init again in the same process, on a new store, works (twice: a second cycle finds what the first left; the
    third world's store is a FileStore, a store of another kind, which its last rank reaches late). Where the
    target splits eager worlds, each cycle also splits a child off the world and uses it: torch 2.11's
    split_group after a re-init segfaulted on NCCL 2.28.9 (scripts/capture_nccl_samples.py's host). Worlds #2
    and #3 must give back the file descriptors they held (``_expect_fds_released``)."""
    with shared_folder(ctx, "lifecycle") as folder:  # the third world's FileStore
        _cycles(ctx, folder)


def _cycles(ctx: CheckContext, folder: Path) -> None:
    n, ranks = ctx.world_size, list(range(ctx.world_size))
    splits = {"split", "device_binding"} <= ctx.target.capabilities
    settled, live = 0, 0  # this process's open fds after world #1 was destroyed; the most while a world lived
    for cycle in (1, 2, 3):
        where = f"world #{cycle} of this process"
        store: dist.Store = dist.PrefixStore(f"api-lifecycle-{cycle}/", ctx.store)
        if cycle == 3:
            where += " (on a FileStore)"
            store = dist.FileStore(str(folder / "store"), n)
            if ctx.rank == n - 1:
                time.sleep(0.3)  # the others wait for it in the world's creation
        try:
            ctx.target.init_world(store, ctx.rank, n, WorldSpec(mode=default_mode(ctx)), ctx.timeout_s)
        except Exception as exc:
            raise RuntimeError(f"rank {ctx.rank}: creating {where}: {type(exc).__name__}: {exc}") from exc
        expect_allreduce_members(ctx, dist.group.WORLD, ranks, where)
        since = ctx.probe.mark()
        doomed = ctx.new_group(ranks)
        expect_allreduce_members(ctx, doomed, ranks, f"{where}: a subgroup before it is destroyed")
        # not on GPU targets: whether ProcessGroupNCCL's teardown leaves its finished Works' state alone was not
        # verified (NCCLComm::abort sets an error that a finished WorkNCCL may then report)
        finished = [] if ctx.target.target.gpu else finish_works(ctx, doomed, ranks, f"{where}: a subgroup")
        made = [e["comm"] for e in new_comms(ctx, since)]  # with the pair communicators of its P2P, where lazy
        since = ctx.probe.mark()
        kept = ctx.new_group(ranks[::-1])
        if cycle == 1:
            _destroy_first(ctx, doomed, where)
        else:
            _destroy_subgroup(ctx, doomed, where)
        _expect_destroyed(ctx, made, since, f"{where}: destroy_process_group(subgroup)")
        expect_kept(ctx, finished)
        expect_allreduce_members(ctx, kept, ranks, f"{where}: a subgroup after another one was destroyed")
        expect_allreduce_members(ctx, dist.group.WORLD, ranks, f"{where}: world after a subgroup was destroyed")
        expect_kept(ctx, finished)  # again, once the other groups ran: a teardown that fails Works later
        if splits:
            child = dist.split_group(split_ranks=[ranks])
            expect_allreduce_members(ctx, child, ranks, f"{where}: a split_group child of the world")
        dist.barrier()
        live = max(live, _open_fds())
        dist.destroy_process_group()
        ctx.expect_equal(f"{where}: dist.is_initialized() after destroy_process_group()", False,
                         dist.is_initialized())
        if cycle == 1:
            settled = _settled_fds(ctx)
    _expect_fds_released(ctx, settled, live)


def _fd_names() -> list[str] | None:
    """The file descriptors this process has open, as /proc/self/fd names them (None where it cannot be read)."""
    try:
        return os.listdir(FD_DIR)
    except OSError:
        return None


def _open_fds() -> int:
    """How many file descriptors this process has open (-1 where /proc/self/fd cannot be read)."""
    names = _fd_names()
    return -1 if names is None else len(names)


def _settled_fds(ctx: CheckContext) -> int:
    """This process's open fds; first the positive control: the listing shows an fd this rank opens itself (by its
    number: the count alone moved under it when a backend thread closed an fd meanwhile, which made rank 3 of a sim
    run leave the check here while its peers waited for it in world #2)."""
    count = _open_fds()
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        listed = str(fd) in (_fd_names() or ())
        positive_control(ctx, count >= 0 and listed, f"an fd this rank opened, in {FD_DIR}")
    finally:
        os.close(fd)
    return count


def _released(settled: int) -> int:
    """This process's open fds, once at most FD_SLACK above ``settled`` or after FD_WAIT_S (a backend may close
    some from a thread of its own, or when its objects are collected)."""
    deadline, collected = time.monotonic() + FD_WAIT_S, False
    while (after := _open_fds()) - settled > FD_SLACK and time.monotonic() < deadline:
        if not collected:
            gc.collect()
            collected = True
        else:
            time.sleep(0.01)
    return after


def _expect_fds_released(ctx: CheckContext, settled: int, live: int) -> None:
    """Worlds #2 and #3, with their subgroups and children, give back every file descriptor they held once
    destroyed: the process holds at most FD_SLACK more than after world #1 was destroyed (what a backend opens
    once, at its first world, stays; one fd leaked per destroyed communicator adds 3 or more a world)."""
    after = _released(settled)
    if ctx.rank == 0:
        ctx.note(f"open fds: {live} at most while a world lived, {settled} after world #1 was destroyed, {after} "
                 "after world #3 was")
    ctx.expect(after - settled <= FD_SLACK, "file descriptors this process holds (/proc/self/fd) after worlds #2 "
               "and #3 and their subgroups were destroyed, beyond those after world #1 was",
               f"at most {FD_SLACK}", after - settled)


def _destroy_subgroup(ctx: CheckContext, group: Any, where: str) -> None:
    """destroy_process_group(group), naming the contract a group that cannot be destroyed breaks: torch unregisters
    a subgroup by its ``group_name`` (v2.13.0 distributed_c10d.py:2457), which a Python ProcessGroup raises on
    unless it overrides it."""
    try:
        dist.destroy_process_group(group)
    except RuntimeError as exc:
        if "ProcessGroup name not set" not in str(exc):
            raise
        raise CheckFailed(f"rank {ctx.rank}: {where}: destroy_process_group(subgroup) raised {exc!r}: torch "
                          "unregisters a subgroup by its group_name, which this backend's group does not provide "
                          "(override group_name: docs/vendor-guide.md, section 2)") from None


def _destroy_first(ctx: CheckContext, group: Any, where: str) -> None:
    """Rank 0 destroys a used subgroup while the other ranks hold off until it says it has (through the store, for
    at most ``FIRST_DESTROY_S``), then they destroy theirs: destroy_process_group(group) is local (torch unregisters
    the group on the calling rank; gloo's shutdown waits for no peer), so rank 0's call returns at once. Rank 0
    posts how long its call took; every rank judges that, so all fail alike. Not tried on GPU targets (whether
    ProcessGroupNCCL's shutdown of a used communicator waits for its peers was not verified): each rank
    destroys its copy at once there. World size 2 or more."""
    if ctx.target.target.gpu or ctx.world_size < 2:
        _destroy_subgroup(ctx, group, where)
        return
    key = "api-lifecycle/destroyed-first"
    what = f"{where}: rank 0's destroy_process_group(subgroup), the other ranks holding off until it returned"
    if ctx.rank == 0:
        begun = time.monotonic()
        _destroy_subgroup(ctx, group, where)
        post(ctx.store, key, f"{time.monotonic() - begun:.3f}".encode())
    try:
        ctx.store.wait([key], timedelta(seconds=FIRST_DESTROY_S))
        took: float | None = float(ctx.store.get(key).decode())
    except RuntimeError:  # DistStoreError: rank 0's call did not return while this rank held off
        took = None
    if ctx.rank != 0:
        _destroy_subgroup(ctx, group, where)
    if took is None:
        raise CheckFailed(f"rank {ctx.rank}: {what}: expected it to return at once (a local call), observed it had "
                          f"not returned after {FIRST_DESTROY_S} s")
    ctx.expect(took < FIRST_DESTROY_S / 2, what, f"it returns at once (a local call; under {FIRST_DESTROY_S / 2} s)",
               f"it returned after {took:.2f} s")


def _expect_destroyed(ctx: CheckContext, made: list[Any], since: int, what: str) -> None:
    """Where the probe records both creation and destruction: every communicator made for a destroyed group
    has been destroyed (its creation, seen by the probe, is the positive control)."""
    if not {"comm_created", "comm_destroyed"} <= ctx.probe.observes:
        return
    positive_control(ctx, bool(made), "the destroyed subgroup's communicator being made")
    gone = {e["comm"] for e in ctx.probe.events("comm_destroyed", since)}
    ctx.expect(set(made) <= gone, f"{what}: communicators of the group destroyed", made, sorted(gone))


@check("API-SINGLETON-GROUP")
def singleton_group(ctx: CheckContext) -> None:
    """Every rank alone in a group (new_group([r]) for each r): each collective is the identity there."""
    ctx.init_world(default_mode(ctx))
    n, r, dev = ctx.world_size, ctx.rank, ctx.device
    groups = [ctx.new_group([q]) for q in range(n)]
    alone = groups[r]
    mine = [float(r * 10 + i + 1) for i in range(4)]

    def t() -> torch.Tensor:
        return torch.tensor(mine, device=dev)

    for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        x = t()
        dist.all_reduce(x, op=op, group=alone)
        expect_exact(ctx, x, mine, f"all_reduce {op} on new_group([{r}])")
    cases: dict[str, Callable[[], torch.Tensor]] = {
        "broadcast": lambda: _ran(dist.broadcast, (x := t()), x, group_src=0, group=alone),
        "reduce": lambda: _ran(dist.reduce, (x := t()), x, dst=r, group=alone),
        "all_gather_into_tensor": lambda: _ran(dist.all_gather_into_tensor, (x := torch.zeros(4, device=dev)), x,
                                               t(), group=alone),
        "reduce_scatter_tensor": lambda: _ran(dist.reduce_scatter_tensor, (x := torch.zeros(4, device=dev)), x,
                                              t(), group=alone),
        "all_to_all_single": lambda: _ran(dist.all_to_all_single, (x := torch.zeros(4, device=dev)), x, t(),
                                          group=alone),
    }
    for op, run in cases.items():
        got = run()
        expect_exact(ctx, got, mine, f"{op} on new_group([{r}])")
    dist.barrier(group=alone)
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(n)), "world after the one-member groups")


def _ran(fn: Callable[..., Any], result: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Call ``fn(*args, **kwargs)`` and return ``result`` (the tensor it writes)."""
    fn(*args, **kwargs)
    return result


@check("API-LIST-COLLECTIVES")
def list_collectives(ctx: CheckContext) -> None:
    """The list forms no other check calls: gather and scatter from every root, all_to_all with uneven
    shapes and with equal ones, all_gather and all_gather_coalesced, each exact in group-rank order or refused
    naming the op (equal-shaped all_to_all: declined as unsupported only)."""
    ctx.init_world(default_mode(ctx))
    n, r, dev = ctx.world_size, ctx.rank, ctx.device
    found = Findings(ctx)  # every rank issues every collective, whatever it found

    def block(src: int, dst: int) -> list[float]:  # what src sends to dst: dst + 1 elements, unique values
        return [float(src * 100 + dst * 10 + i) for i in range(dst + 1)]

    def declined(*ops: str) -> tuple[str, ...]:  # a refusal names the op; torch's own error for a Python
        return (*ops, NO_OP)  # ProcessGroup that lacks the op names the device instead (noted in the report)

    world = list(range(n))
    _gather_scatter(ctx, found, block, declined, None, world, "")
    _gather_single(ctx, found, block)
    _uneven_all_to_all(ctx, found, block, declined, None, world, "")
    # equal shapes, which gloo supports (it refuses the uneven ones above for their sizes): a backend may decline
    # the list form only as unsupported, not refuse these shapes as disagreeing
    outs = [torch.zeros(2, device=dev) for _ in range(n)]
    ins = [torch.tensor(block(r, j)[:1] * 2, device=dev) for j in range(n)]
    if optional_case(ctx, "all_to_all (lists, equal shapes)", lambda: dist.all_to_all(outs, ins), UNSUPPORTED):
        for j, t in enumerate(outs):
            found.case(expect_exact, ctx, t, block(j, r)[:1] * 2, f"all_to_all, equal shapes: block from rank {j}")
    gathered = [torch.zeros(2, device=dev) for _ in range(n)]
    dist.all_gather(gathered, torch.tensor(block(r, 1), device=dev))
    for j, t in enumerate(gathered):
        found.case(expect_exact, ctx, t, block(j, 1), f"all_gather: tensor from rank {j}")
    found.checkpoint()
    unsorted = unsorted_group(ctx)
    _uneven_all_gather(ctx, found, block, unsorted)
    lists = [[torch.zeros(1, device=dev), torch.zeros(2, device=dev)] for _ in range(n)]
    if optional_case(ctx, "all_gather_coalesced", lambda: dist.all_gather_coalesced(
            lists, [torch.tensor(block(r, 0), device=dev), torch.tensor(block(r, 1), device=dev)]),
            UNSUPPORTED):  # gloo runs it: a backend has it or says it has not, as for gather_single
        for j, pair in enumerate(lists):
            for k, t in enumerate(pair):
                found.case(expect_exact, ctx, t, block(j, k), f"all_gather_coalesced: tensor {k} of rank {j}")
        found.case(_coalesced_longer_refused, ctx, block)
    found.checkpoint()
    _lists_in_subgroups(ctx, found, block, declined, unsorted)
    found.conclude()


# Per-member sizes of an uneven all_gather (member j of n): growing, the first empty, the last empty, one member's
# tensor only (an empty input is a member's whole part in a gather of expert tokens or of a ragged batch)
UNEVEN_GATHER_SIZES: tuple[tuple[str, Callable[[int, int], int]], ...] = (
    ("group rank j's has j + 1 elements", lambda j, n: j + 1),
    ("group rank j's has j elements: the first is empty", lambda j, n: j),
    ("group rank j's has n - 1 - j elements: the last is empty", lambda j, n: n - 1 - j),
    ("only the last group rank's has elements (2)", lambda j, n: 2 if j == n - 1 else 0),
)


def _uneven_all_gather(ctx: CheckContext, found: Findings, block: Callable[[int, int], list[float]],
                       unsorted: dist.ProcessGroup | None) -> None:
    """all_gather whose members' tensors differ in size (each pattern of ``UNEVEN_GATHER_SIZES``, every member
    naming the same output sizes): torch documents it ('Complex and uneven sized tensors are supported', v2.13.0
    distributed_c10d.py:4196), ProcessGroupNCCL runs it (each member's tensor broadcast in turn where the outputs
    differ in size), gloo refuses it naming the size ('invalid tensor size at index 1 (expected (1), got (2))',
    seen on 2.13.0). Exact in group-rank order, and required where the target declares ``uneven_all_gather``;
    elsewhere it may be refused naming the size or shape, on the world and on the unsorted group alike."""
    required = "uneven_all_gather" in ctx.target.capabilities
    world = list(range(ctx.world_size))
    groups: list[tuple[str, Any, list[int]]] = [("world", None, world)]
    if unsorted is not None:
        groups.append((f"unsorted group {world[::-1]}", unsorted, world[::-1]))

    def values(m: int, size: int) -> list[float]:  # global rank m's tensor of ``size`` elements
        return block(m, size - 1) if size else []

    for pattern, size_of in UNEVEN_GATHER_SIZES:
        for label, group, members in groups:
            sizes = [size_of(j, len(members)) for j in range(len(members))]
            what = f"{label}: all_gather of uneven tensors ({pattern}: {sizes})"
            outs = [torch.zeros(size, device=ctx.device) for size in sizes]
            mine = torch.tensor(values(ctx.rank, sizes[members.index(ctx.rank)]), device=ctx.device)
            call = functools.partial(dist.all_gather, outs, mine, group=group)
            if required:
                found.case(_required_call, ctx, what, call)
            elif not optional_case(ctx, what, call, ("size", "shape", "uneven"), kind="all_gather (uneven)"):
                continue
            for j, m in enumerate(members):
                found.case(expect_exact, ctx, outs[j], values(m, sizes[j]), f"{what}: tensor of global rank {m}")


def _required_call(ctx: CheckContext, what: str, call: Callable[[], Any]) -> None:
    """``call()``, whose any error is a finding naming ``what``."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - a required case: any error fails it, named
        raise CheckFailed(f"rank {ctx.rank}: {what}: expected a result, observed {type(exc).__name__}: {exc}") from None


def _lists_in_subgroups(ctx: CheckContext, found: Findings, block: Callable[[int, int], list[float]],
                        declined: Callable[..., tuple[str, ...]], unsorted: dist.ProcessGroup | None) -> None:
    """gather and scatter from every root and the uneven all_to_all again on the group of the ranks above 0, where
    group rank j is global rank j + 1, and on the world kept in reverse order (``unsorted``), where group
    rank j is global rank n - 1 - j (roots named by global rank, as torch takes them): a backend that reads a
    group rank as a global one, or ranks its members sorted, gathers from or scatters to the wrong rank. Each op
    runs there exactly when it ran on the world (the same kinds)."""
    if ctx.world_size < 2:  # no group above rank 0, and no order to differ
        return
    members = list(range(1, ctx.world_size))
    group = ctx.new_group(members)
    if ctx.rank in members and len(members) > 1:
        _gather_scatter(ctx, found, block, declined, group, members, f"ranks {members}: ")
        _uneven_all_to_all(ctx, found, block, declined, group, members, f"ranks {members}: ")
    if unsorted is not None:
        order = list(range(ctx.world_size))[::-1]
        _gather_scatter(ctx, found, block, declined, unsorted, order, f"unsorted group {order}: ")
        _uneven_all_to_all(ctx, found, block, declined, unsorted, order, f"unsorted group {order}: ")


def _gather_scatter(ctx: CheckContext, found: Findings, block: Callable[[int, int], list[float]],
                    declined: Callable[..., tuple[str, ...]], group: Any, members: list[int], where: str) -> None:
    """gather to and scatter from every member of ``group`` (None: the world), roots named by global rank: each
    exact in group-rank order, or refused naming the op (alike for every root: optional_case's kinds)."""
    r, dev = ctx.rank, ctx.device
    for root in members:
        got = [torch.zeros(3, device=dev) for _ in members] if r == root else None
        if optional_case(ctx, f"{where}gather to root {root}", lambda got=got, root=root: dist.gather(
                torch.tensor(block(r, 2), device=dev), gather_list=got, dst=root, group=group), declined("gather"),
                kind="gather (lists)") and got:
            for j, t in zip(members, got):
                found.case(expect_exact, ctx, t, block(j, 2), f"{where}gather to root {root}: block from rank {j}")
        out = torch.zeros(3, device=dev)  # gloo scatters equal sizes only
        sent = [torch.tensor(block(root, j)[:1] * 3, device=dev) for j in members] if r == root else None
        if optional_case(ctx, f"{where}scatter from root {root}", lambda out=out, sent=sent, root=root:
                         dist.scatter(out, scatter_list=sent, src=root, group=group), declined("scatter"),
                         kind="scatter (lists)"):
            found.case(expect_exact, ctx, out, block(root, r)[:1] * 3, f"{where}scatter from root {root}")


def _uneven_all_to_all(ctx: CheckContext, found: Findings, block: Callable[[int, int], list[float]],
                       declined: Callable[..., tuple[str, ...]], group: Any, members: list[int], where: str) -> None:
    """all_to_all of uneven tensor lists among ``members`` on ``group`` (None: the world): member j's block
    from each other member, exact, or refused naming the op."""
    r, dev = ctx.rank, ctx.device
    outs = [torch.zeros(r + 1, device=dev) for _ in members]
    ins = [torch.tensor(block(r, j), device=dev) for j in members]
    if optional_case(ctx, f"{where}all_to_all (lists, uneven)", lambda: dist.all_to_all(outs, ins, group=group),
                     declined("alltoall", "all_to_all"), kind="all_to_all (lists, uneven)"):
        for j, t in zip(members, outs):
            found.case(expect_exact, ctx, t, block(j, r), f"{where}all_to_all: block from rank {j}")


def _coalesced_longer_refused(ctx: CheckContext, block: Callable[[int, int], list[float]]) -> None:
    """all_gather_coalesced whose output lists are one longer than the inputs is refused on every rank naming the
    mismatch (torch's front end checks only that each is a list of tensors, v2.13.0 distributed_c10d.py:4523-4531:
    'C++ code will do shape and type checking', :4518; gloo: 'ProcessGroupGloo::allgather_coalesced: invalid
    output size: (expected length 2, got 3)', seen on 2.13.0 and 2.15.0); then the world's all_reduce is exact."""
    dev = ctx.device
    longer = [[torch.zeros(1, device=dev), torch.zeros(2, device=dev), torch.zeros(2, device=dev)]
              for _ in range(ctx.world_size)]
    ins = [torch.tensor(block(ctx.rank, 0), device=dev), torch.tensor(block(ctx.rank, 1), device=dev)]
    expect_raises(ctx, "all_gather_coalesced with output lists of 3 tensors for 2 inputs",
                  lambda: dist.all_gather_coalesced(longer, ins), contains=(("output",), ("input", "expected length")))
    expect_allreduce_members(ctx, dist.group.WORLD, list(range(ctx.world_size)),
                             "world after the refused all_gather_coalesced")


def _gather_single(ctx: CheckContext, found: Findings, block: Callable[[int, int], list[float]]) -> None:
    """torch >= 2.15's gather into one tensor (dist.gather_single, v2.15.0 distributed_c10d.py:5719; the backend's
    own gather_single), to every root, into a contiguous output and into a strided view of a larger one: the
    root's tensor holds each rank's block in group-rank order; or it is declined as unsupported (c10d's 'Backend gloo
    does not support gather_single', torch's NO_OP for a Python group without it), not refused for another reason:
    the op is new, so a backend either has it or says it has not."""
    gather_single = getattr(dist, "gather_single", None)
    if gather_single is None:
        ctx.note(f"gather_single not tried: torch {torch.__version__} has none (added in 2.15)")
        return
    n, r, dev = ctx.world_size, ctx.rank, ctx.device
    want = [x for j in range(n) for x in block(j, 2)]
    ran = False
    for root in range(n):
        for layout in ("contiguous", "strided"):
            whole = torch.full((n * 3, 2), -1.0, device=dev)
            got = (whole[:, 0] if layout == "strided" else whole[:, 0].contiguous()) if r == root else None
            if optional_case(ctx, f"gather_single to root {root} ({layout} output)",
                             lambda got=got, root=root: gather_single(torch.tensor(block(r, 2), device=dev), got,
                                                                      dst=root),
                             UNSUPPORTED, kind=f"gather_single ({layout} output)"):
                ran = True
                if got is not None:
                    found.case(expect_exact, ctx, got, want, f"gather_single to root {root} ({layout} output)")
    if ran:  # every rank alike: a backend declines an op on every rank or on none
        found.case(_gather_single_oversized, ctx, gather_single)


def _gather_single_oversized(ctx: CheckContext, gather_single: Callable[..., Any]) -> None:
    """gather_single of 2 elements per rank into 2n + 1 on root 0 is refused there, naming both sizes (torch 2.15
    checks the dtypes only, v2.15.0 distributed_c10d.py:5805 _ensure_all_tensors_same_dtype, not the size); the
    other ranks raise too or return, never hang; then gather_single into 2n elements is exact."""
    n, r, dev = ctx.world_size, ctx.rank, ctx.device
    mine = torch.tensor([float(10 * r), float(10 * r + 1)], device=dev)
    big = torch.full((2 * n + 1,), -1.0, device=dev) if r == 0 else None
    what = f"gather_single of float32[2] per rank into float32[{2 * n + 1}] on root 0"
    failed: CheckFailed | None = None
    if r == 0:
        try:
            expect_raises(ctx, what, lambda: gather_single(mine, big, dst=0),
                          contains=(str(2 * n + 1), ("[2]", f"{n} x", str(2 * n))))
        except CheckFailed as exc:  # reported after the steps every rank takes, so that the ranks stay in step
            failed = exc
    else:
        with contextlib.suppress(Exception):  # a peer may be told of the root's refusal, or not
            gather_single(mine, None, dst=0)
    dist.barrier()
    exact = torch.full((2 * n,), -1.0, device=dev) if r == 0 else None
    gather_single(mine, exact, dst=0)
    if failed is not None:
        raise failed
    if exact is not None:
        want = [float(10 * j + i) for j in range(n) for i in range(2)]
        expect_exact(ctx, exact, want, f"{what}: then into float32[{2 * n}]")




@check("API-OP-PROGRAMS")
def op_programs(ctx: CheckContext) -> None:
    """Seeded programs of collectives and P2P over the world and its subgroups, some async and waited out of
    order: every output exact when its op returns or its wait does, and still at the program's end."""
    ctx.init_world(default_mode(ctx))
    check_programs(ctx)


@check("API-GROUP-PROGRAMS")
def group_programs(ctx: CheckContext) -> None:
    """Seeded programs of group creation (new_group, split_group, given options or none), use (a collective, a
    message by each P2P entry point) and destruction, on bound and lazy worlds, each judged against the model of
    which communicators each step makes and which options each group holds (``group_program_runs``)."""
    check_group_programs(ctx)


@check("API-PROCESS-STATE")
def process_state(ctx: CheckContext) -> None:
    """Init and a run of every op family leave the process-wide state the user owns as it was (process_state)."""
    check_process_state(ctx)
