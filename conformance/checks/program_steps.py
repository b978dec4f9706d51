"""Issuing one step of a generated program on this rank, and what its tensors must hold afterwards.

Every tensor a step passes is a view GUARD elements into a buffer of sentinels, shaped as the step says
(``Watched``): outputs must hold exactly what the op gives, inputs their own values, and nothing around them
may change. A barrier's members must all have entered it (each posts a key to the check's store first). A step
drawn to run ``again`` runs a second time on the same buffers, refilled in place with other values (as DDP's
buckets and FSDP's flat parameters are), judged both times.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.common import SCALAR_WORDS, finish_work, optional_case, post
from conformance.checks.data import Placed
from conformance.checks.programs import (
    AGAIN,
    GUARD,
    POLL_S,
    Step,
    joined_shape,
    piece_shape,
    reduced,
    refusal_words,
    sentinel,
    values,
)
from conformance.checks.reference import dtype_name
from conformance.checks.registry import CheckContext

FUTURE_WORDS = ("not implemented", "getFuture", "does not support", "not supported")  # a Work without a future


@dataclass
class Watched:
    """A tensor a step passes to the backend: a view GUARD elements into a buffer whose other elements hold the
    sentinel; ``want``: the values the view must hold (None: unspecified), ``what`` names it."""

    view: torch.Tensor
    buffer: torch.Tensor
    want: torch.Tensor | None
    what: str
    placed: Placed = field(init=False)

    def __post_init__(self) -> None:
        self.placed = Placed(self.view, self.buffer, "program")

    def problem(self) -> str | None:
        """What is wrong with it now, or None: it no longer views the memory it was given (``Placed.rebound``: the
        caller's tensor is not the backend's to reshape in place, ``unsqueeze_``, or to rebind), a write outside it,
        a wrong value."""
        moved = self.placed.rebound()
        if moved is not None:
            return f"{self.what}: {moved}"
        count = self.view.numel()
        guards = torch.cat([self.buffer[:GUARD], self.buffer[GUARD + count:]])
        unset = sentinel(self.buffer.dtype)
        if bool((guards != unset).any()):
            return (f"{self.what}: the backend wrote outside the tensor it was given (a view at offset {GUARD} "
                    f"of {count} elements): the elements around it were {unset}, observed "
                    f"{self.buffer[:GUARD].tolist()} before it and {self.buffer[GUARD + count:].tolist()} after")
        if self.want is None:
            return None
        got = self.view.detach().cpu().reshape(-1)
        # compared exactly: in float64 for a floating dtype, in int64 for an integer one (every value is exact in it)
        exact = torch.float64 if got.dtype.is_floating_point else torch.int64
        got, want = got.to(exact), self.want.to(exact)
        bad = (got != want).nonzero().flatten()
        if not len(bad):
            return None
        first = bad[:4]
        return (f"{self.what}: {len(bad)} of {len(want)} elements differ; at {first.tolist()}: expected "
                f"{want[first].tolist()}, observed {got[first].tolist()}")


@dataclass
class Issued:
    """An op issued by this rank: its step, its Works (none once settled), the tensors to check, a barrier's
    arrival keys (set by each member just before entering it), problems already seen (a first run), and whether
    its group is a Python ProcessGroup (``_poll``)."""

    step: Step
    works: list[Any]
    watched: list[Watched]
    arrivals: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    python_group: bool = False

    def problems(self, ctx: CheckContext) -> list[str]:
        """What is wrong with its tensors now (and, for a barrier, who had not entered it)."""
        found = [p for w in self.watched if (p := w.problem()) is not None]
        late = [key.rsplit("/", 1)[1] for key in self.arrivals if not ctx.store.check([key])]
        if late:
            found.append(f"it returned before members {late} had entered it (each posts a key to the check's "
                         "store first)")
        return found


class _Tensors:
    """Makes a step's guarded tensors on this rank: new buffers, or ``reuse``'s in the same order, refilled."""

    def __init__(self, ctx: CheckContext, step: Step, members: list[int], reuse: list[torch.Tensor] | None) -> None:
        self.step, self.members, self.device = step, members, ctx.device
        self.watched: list[Watched] = []
        self._spare = list(reuse or [])

    def sent(self, sender: int, count: int, start: int = 0) -> torch.Tensor:
        """Elements ``start``.. of what ``sender`` contributes."""
        return values(self.step, sender, start, count, len(self.members))

    def every(self, count: int, start: int = 0) -> torch.Tensor:
        """Every member's ``sent``, in group-rank order."""
        return torch.cat([self.sent(m, count, start) for m in self.members])

    def make(self, shape: tuple[int, ...], holds: torch.Tensor | None, want: torch.Tensor | None,
             what: str) -> torch.Tensor:
        """A view of ``shape`` GUARD elements into a buffer of sentinels, holding ``holds`` (None: sentinels)."""
        dtype, count = self.step.dtype, int(torch.Size(shape).numel())
        buffer = self._spare.pop(0) if self._spare else torch.empty(count + 2 * GUARD, dtype=dtype, device=self.device)
        buffer.fill_(sentinel(dtype))
        view = buffer[GUARD:GUARD + count].view(shape)
        if holds is not None:
            view.copy_(holds.view(shape))
        self.watched.append(Watched(view, buffer, want, what))
        return view

    def piece(self, count: int, holds: torch.Tensor | None, want: torch.Tensor | None, what: str,
              flat: bool = False) -> torch.Tensor:
        """One rank's piece of ``count`` elements, in the step's shape (or flat)."""
        return self.make((count,) if flat else piece_shape(self.step, count), holds, want, what)

    def joined(self, count: int, holds: torch.Tensor | None, want: torch.Tensor | None, what: str,
               flat: bool = False) -> torch.Tensor:
        """Every member's piece of ``count`` elements joined along dim 0 (or flat)."""
        n = len(self.members)
        return self.make((n * count,) if flat else joined_shape(self.step, n, count), holds, want, what)


@dataclass
class _Prepared:
    watched: list[Watched]
    call: Callable[[], Any]
    arrivals: list[str]


def _prepare(ctx: CheckContext, step: Step, group: Any, members: list[int], run: str,
             reuse: list[torch.Tensor] | None) -> _Prepared:
    """The step's tensors (new buffers, or ``reuse``'s in the same order, refilled) and the call that issues it."""
    r, k, n = ctx.rank, step.numel, len(members)
    me = members.index(r)
    ts = _Tensors(ctx, step, members, reuse)
    sent, arrivals = ts.sent, []
    call: Callable[[], Any]
    flag = {"async_op": step.is_async, "group": group}
    root = members[step.root % n]
    reduce_op = getattr(dist.ReduceOp, step.op)
    if step.kind == "all_reduce":
        t = ts.piece(k, sent(r, k), reduced(step.op, [sent(m, k) for m in members]), "the tensor")
        call = lambda: dist.all_reduce(t, op=reduce_op, **flag)  # noqa: E731
    elif step.kind == "broadcast":
        t = ts.piece(k, sent(r, k), sent(root, k), f"the tensor (from {root})")
        call = lambda: dist.broadcast(t, src=root, **flag)  # noqa: E731
    elif step.kind == "reduce":  # what non-roots hold afterwards is unspecified
        t = ts.piece(k, sent(r, k), reduced(step.op, [sent(m, k) for m in members]) if r == root else None,
                     f"the tensor (root {root})")
        call = lambda: dist.reduce(t, dst=root, op=reduce_op, **flag)  # noqa: E731
    elif step.kind == "all_gather_into_tensor":
        t, out = ts.piece(k, sent(r, k), sent(r, k), "the input"), ts.joined(k, None, ts.every(k), "the output")
        call = lambda: dist.all_gather_into_tensor(out, t, **flag)  # noqa: E731
    elif step.kind == "reduce_scatter_tensor":
        t = ts.joined(k, sent(r, n * k), sent(r, n * k), "the input")
        out = ts.piece(k, None, reduced(step.op, [sent(m, k, me * k) for m in members]), "the output")
        call = lambda: dist.reduce_scatter_tensor(out, t, op=reduce_op, **flag)  # noqa: E731
    elif step.kind == "all_to_all_single":
        t = ts.joined(k, sent(r, n * k), sent(r, n * k), "the input")
        out = ts.joined(k, None, ts.every(k, me * k), "the output")
        call = lambda: dist.all_to_all_single(out, t, **flag)  # noqa: E731
    elif step.kind == "all_gather":
        t = ts.piece(k, sent(r, k), sent(r, k), "the input")
        outs = [ts.piece(k, None, sent(m, k), f"the tensor from {m}") for m in members]
        call = lambda: dist.all_gather(outs, t, **flag)  # noqa: E731
    elif step.kind == "gather":
        t = ts.piece(k, sent(r, k), sent(r, k), "the input")
        got = [ts.piece(k, None, sent(m, k), f"the tensor from {m}") for m in members] if r == root else None
        call = lambda: dist.gather(t, gather_list=got, dst=root, **flag)  # noqa: E731
    elif step.kind == "scatter":
        chunks = [ts.piece(k, sent(r, k, j * k), sent(r, k, j * k), f"the chunk for {m}")
                  for j, m in enumerate(members)] if r == root else None
        out = ts.piece(k, None, sent(root, k, me * k), f"the chunk from {root}")
        call = lambda: dist.scatter(out, scatter_list=chunks, src=root, **flag)  # noqa: E731
    elif step.kind == "barrier":
        arrivals = [f"program-barrier/{run}/{step.index}/{m}" for m in members]

        def call() -> Any:
            post(ctx.store, arrivals[me], b"entered")  # held by the store before this rank enters
            return dist.barrier(**flag)
    elif step.kind == "pair":  # the first member sends to the last, which receives it by name
        first, last = members[0], members[-1]
        if r == first:
            t = ts.piece(k, sent(r, k), sent(r, k), "the input")
            send = dist.isend if step.is_async else dist.send
            call = lambda: send(t, dst=last, group=group, tag=step.tag)  # noqa: E731
        elif r == last:
            out = ts.piece(k, None, sent(first, k), f"the tensor from {first}")
            recv = dist.irecv if step.is_async else dist.recv
            call = lambda: recv(out, src=first, group=group, tag=step.tag)  # noqa: E731
        else:
            call = lambda: None  # noqa: E731
    elif step.kind == "coalesced":
        call = _block(ts, step, group, me, reduce_op)
    else:  # ring: send to the next member, receive from the previous one, in one batch
        nxt, prev = members[(me + 1) % n], members[(me - 1) % n]
        t = ts.piece(k, sent(r, k), sent(r, k), "the input")
        out = ts.piece(k, None, sent(prev, k), f"the tensor from {prev}")
        ops = [dist.P2POp(dist.isend, t, nxt, group=group, tag=step.tag),
               dist.P2POp(dist.irecv, out, prev, group=group, tag=step.tag)]
        call = lambda: dist.batch_isend_irecv(ops)  # noqa: E731
    return _Prepared(ts.watched, call, arrivals)


def _block(ts: _Tensors, step: Step, group: Any, me: int, reduce_op: Any) -> Callable[[], Any]:
    """Two ops of ``step.inner`` in one _coalescing_manager block: the first of the step's shape and numel, the
    second flat and one element longer (a block packed at the wrong offsets shows in the second)."""
    members, r, n = ts.members, ts.members[me], len(ts.members)
    calls: list[Callable[[], Any]] = []
    for j, count in enumerate((step.numel, step.numel + 1)):
        name, flat = f"op {j} of the block", j == 1
        if step.inner == "all_reduce":
            t = ts.piece(count, ts.sent(r, count, j), reduced(step.op, [ts.sent(m, count, j) for m in members]),
                         f"{name}: the tensor", flat)
            calls.append(lambda t=t: dist.all_reduce(t, op=reduce_op, group=group))
        elif step.inner == "all_gather_into_tensor":
            mine = ts.sent(r, count, j)
            t = ts.piece(count, mine, mine, f"{name}: the input", flat)
            out = ts.joined(count, None, ts.every(count, j), f"{name}: the output", flat)
            calls.append(lambda out=out, t=t: dist.all_gather_into_tensor(out, t, group=group))
        else:
            mine = ts.sent(r, n * count, j)
            t = ts.joined(count, mine, mine, f"{name}: the input", flat)
            out = ts.piece(count, None, reduced(step.op, [ts.sent(m, count, j + me * count) for m in members]),
                           f"{name}: the output", flat)
            calls.append(lambda out=out, t=t: dist.reduce_scatter_tensor(out, t, op=reduce_op, group=group))

    def call() -> Any:
        with dist._coalescing_manager(group=group, async_ops=step.is_async) as manager:
            for one in calls:
                one()
        return manager.works if step.is_async else None
    return call


def _works(result: Any) -> list[Any]:
    return result if isinstance(result, list) else [] if result is None or isinstance(result, int) else [result]


def issue(ctx: CheckContext, step: Step, group: Any, members: list[int], what: str, run: str) -> Issued | None:
    """Issue ``step`` (``what`` describes it; ``run`` names this run of its program) on this rank, a member of its
    group; None when the target declines its kind (``optional_case``). A step that runs ``again`` runs first
    sync, is judged, and is then issued once more on the same buffers refilled with the values of step index +
    AGAIN (sync or async as drawn)."""
    reduces = step.op if step.reduces else None
    scalar = not piece_shape(step, step.numel)
    # an op that moves data without reducing it is one op for every dtype (collective_cases.run): a backend runs it
    # on every dtype or declines it on all
    moved = "" if step.reduces or step.kind == "barrier" else "any dtype"
    support = f"program: {step.kind} {step.inner if step.kind == 'coalesced' else ''} {reduces or ''} " \
              f"{moved or dtype_name(step.dtype)}{' 0-d' if scalar else ''}"
    # a 0-d piece may be refused naming its size or shape, as gloo does in all_gather_into_tensor ('invalid tensor
    # size at index 0 (expected (), got (1))', torch 2.13.0 and 2.15.0: it takes the concatenated output only,
    # where torch documents the stacked one too), alike on every 0-d step of the kind
    words = (*refusal_words(reduces, step.dtype), *(SCALAR_WORDS if scalar else ()))
    first = replace(step, is_async=False) if step.again else step
    prepared = _prepare(ctx, first, group, members, run, None)
    works: list[Any] = []
    if not optional_case(ctx, f"program step {what}", lambda: works.extend(_works(prepared.call())),
                         words, kind=support):
        return None
    seen: list[str] = []
    if step.again:
        for work in works:
            finish_work(ctx, what, work)
        issued = Issued(first, [], prepared.watched, prepared.arrivals)
        seen = [f"first run: {p}" for p in issued.problems(ctx)]
        second = replace(step, index=step.index + AGAIN)
        prepared = _prepare(ctx, second, group, members, run, [w.buffer for w in prepared.watched])
        works = _works(prepared.call())
    if not step.is_async:
        for work in works:  # batch_isend_irecv's and isend/irecv's works: a sync step waits them at once
            finish_work(ctx, what, work)
        works = []
    python_group = not type(group).__module__.startswith("torch")
    return Issued(step, works, prepared.watched, prepared.arrivals, seen, python_group)


def complete(ctx: CheckContext, issued: Issued, what: str) -> list[str]:
    """Complete an issued async step as it was drawn to be (``Step.finish``), and the problems a callback
    chained on its futures saw when it ran ('then'). A kind whose Works have no future (gloo's reduce_scatter)
    is completed by wait() instead, noted once as the optional-op rule notes a refusal."""
    style, works = issued.step.finish, issued.works
    if style == "poll" and not ctx.poll_failed:
        return _poll(ctx, works, what, issued.python_group)
    futures: list[Any] = []
    if style != "wait" and works:
        try:
            futures = [w.get_future() for w in works]
        except RuntimeError as exc:
            if not any(word.lower() in str(exc).lower() for word in FUTURE_WORDS):
                raise
            kind = f"future of program {issued.step.kind}"
            optional_case(ctx, f"{what}: get_future()", functools.partial(_raise, exc), FUTURE_WORDS, kind=kind)
            futures = []
    if not futures:
        for work in works:
            finish_work(ctx, what, work)
        return []
    if style == "future":
        for future in futures:
            future.wait()
    elif style == "wait_all":
        torch.futures.wait_all(futures)
    else:  # then: a callback on all of them reads the outputs when it runs
        chained = torch.futures.collect_all(futures).then(lambda _: issued.problems(ctx))
        return [f"read by a callback chained on the futures: {p}" for p in chained.wait()]
    return []


def _poll(ctx: CheckContext, works: list[Any], what: str, python_group: bool) -> list[str]:
    """Poll every Work's is_completed() until all are, for at most POLL_S; the step is then judged without a
    wait(): a backend that writes the outputs only in wait() fails there. One whose is_completed() stays False
    is a problem; its Works are then waited, and later polled steps of the check are completed by wait() (each
    would cost POLL_S more)."""
    deadline = time.monotonic() + POLL_S
    # for an op a Python ProcessGroup implements below the group (toyccl's alltoall_base) torch hands back a base
    # Work of its own, not the backend's (seen on 2.13: is_completed() False even after wait(), its future done):
    # that Work's state is torch's, so its future is polled instead (C++ backends' Works are base Works too, and
    # their own)
    done = [work.get_future().done if python_group and type(work) is dist.Work else work.is_completed
            for work in works]
    while not all(ask() for ask in done):
        if time.monotonic() > deadline:
            ctx.poll_failed = True
            for work in works:
                finish_work(ctx, what, work)
            return [f"is_completed() still False {POLL_S:.0f} s after every member had issued the op (never waited: "
                    "c10d's Work::isCompleted is true once the op has run); later polled steps use wait()"]
        time.sleep(0.001)
    return []


def _raise(exc: BaseException) -> None:
    raise exc
