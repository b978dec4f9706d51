"""Generated programs: seeded sequences of collectives and P2P, interleaved over several live groups.

The data checks judge each op alone. A backend keeps state between ops (sequence numbers, store keys, buffers,
caches per group or per pair), and a bug there shows only when ops of several kinds, groups and sizes follow
one another, some of them async and still outstanding while others run, waited in an order other than the
order they were issued in. A program is such a sequence, drawn from the seed: every rank draws the same
steps; each rank draws its own wait order. Every output is exact: inputs are small integers from (step,
sending rank, element), so every rank computes what each member receives (exact in every dtype used here,
under any reduction of up to 8 ranks). An output is checked when its op returns (sync) or its wait returns
(async), and every output again at the end of the program: a later op must not write into an earlier one's.

A failing program is shrunk (``shrink``): all steps made sync, then steps removed one at a time, each
candidate run by every rank and judged through the check's store; the failure names the seed and the
shortest failing program found.
"""

from __future__ import annotations

import datetime
import functools
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.cases import stable_seed
from conformance.checks.common import UNSUPPORTED, finish_work, optional_case
from conformance.checks.generated import MAX_SHRINK_STEPS, agree
from conformance.checks.reference import dtype_name, mismatch
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed
from conformance.torch_compat import nonmember_new_group_works

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
         "all_to_all_single", "all_gather", "gather", "scatter", "barrier", "ring", "pair", "coalesced")
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.float16, torch.int8,
          torch.uint8)
NUMELS = (1, 2, 3, 8, 33, 257, 4099, 70001)  # elements per rank (per block where the op has blocks)
NUMEL_WEIGHTS = (4, 4, 4, 4, 3, 3, 2, 1)
# int32 and int64 values sit this far from 0 (by the sender's rank mod 3), past float32's and float64's exact
# integers: an accumulation through a float type shows; sums of 8 ranks still fit
OFFSETS = {torch.int32: 2**27, torch.int64: 2**53}
FLOAT_OPS = ("SUM", "SUM", "MIN", "MAX", "PRODUCT", "AVG")  # AVG on groups of 1, 2, 4 or 8 members only
INT_OPS = ("SUM", "SUM", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR")
REDUCING = ("all_reduce", "reduce", "reduce_scatter_tensor", "coalesced")
TAGS = (0, 1, 7, 2**31 - 1)
STEPS = 16  # per program
PROGRAMS = 6  # at the default budget; one more per unit of budget above it
ASYNC_SHARE = 0.5
WAIT_SHARE = 0.35  # after each step, the chance (repeated) that this rank waits an outstanding op now
P2P = ("ring", "pair")  # kinds that need two members
SENTINEL = -99  # what an output holds before the op writes it, and the guards around every tensor always (uint8: 255)
GUARD = 3  # elements of SENTINEL either side of every tensor a step passes
RAISED = "raised"


@dataclass(frozen=True)
class Step:
    """One op of a program: its kind, group (index into the program's groups), dtype, elements per rank (or
    per block), reduce op, root (a member's index), tag, whether it is async, and its index in the drawn
    program (which seeds its data, so a shrunk program sends the same values)."""

    index: int
    kind: str
    group: int
    dtype: torch.dtype
    numel: int
    op: str
    root: int
    tag: int
    is_async: bool

    def describe(self, groups: list[list[int]]) -> str:
        members = groups[self.group]
        parts = [f"#{self.index} {self.kind}", f"group {members}", dtype_name(self.dtype), f"{self.numel} el"]
        if self.kind in REDUCING:
            parts.append(self.op)
        if self.kind in ("broadcast", "reduce"):
            parts.append(f"root {members[self.root % len(members)]}")
        if self.kind in ("ring", "pair") and self.tag:
            parts.append(f"tag {self.tag}")
        parts.append("async" if self.is_async else "sync")
        return " ".join(parts)


def program_partitions(world_size: int) -> list[list[list[int]]]:
    """The groups programs draw from, as partitions of the ranks (sorted global ranks; empty parts dropped): the
    world again as a group of its own, both halves, odd and even ranks, rank 0 and the ranks above it, and the
    first and last rank with the ranks between them. Each partition is made in one go (``make_partition``)."""
    ranks = list(range(world_size))
    half = max(1, world_size // 2)
    ends = sorted({0, world_size - 1})
    shapes = [[ranks], [ranks[:half], ranks[half:]], [ranks[0::2], ranks[1::2]], [ranks[:1], ranks[1:]],
              [ends, [r for r in ranks if r not in ends]]]
    return [[part for part in parts if part] for parts in shapes]


def make_partition(ctx: CheckContext, parts: list[list[int]]) -> list[Any]:
    """Each part's group (NON_GROUP_MEMBER where this rank is not in it), every rank in exactly one. Where a
    bound world cannot take non-members through new_group (``CheckContext.new_group``), one split_group of every
    part: a split that leaves ranks out registers a group on its members only, and torch before 2.15 salts the
    hashed name of the next split with that count, so members of a later split would name their group
    differently (v2.13.0 distributed_c10d.py:5464-5468; 2.15 salts with a count every rank keeps,
    v2.15.0 :6728-6740). Elsewhere a new_group per part, as torch requires, in order."""
    world = dist.group.WORLD
    if nonmember_new_group_works(ctx.target.target.stack) or world is None or world.bound_device_id is None \
            or len(parts) == 1:
        return [ctx.new_group(part) for part in parts]
    mine = dist.split_group(split_ranks=parts, timeout=datetime.timedelta(seconds=ctx.timeout_s))
    return [mine if ctx.rank in part else dist.GroupMember.NON_GROUP_MEMBER for part in parts]


def draw_program(seed: int, number: int, groups: list[list[int]], tags: bool, offered: tuple[str, ...]) -> list[Step]:
    """Program ``number`` of the run with ``seed``, of the ``offered`` kinds: the same steps on every rank."""
    rng = random.Random(stable_seed(seed, "program", number, tuple(map(tuple, groups))))
    steps, kinds = [], []
    pairs = [i for i, g in enumerate(groups) if len(g) > 1]
    for index in range(STEPS):
        if not kinds:  # every kind once before any twice
            kinds = [k for k in offered if k not in P2P or pairs]
            rng.shuffle(kinds)
        kind = kinds.pop()
        group = rng.choice(pairs) if kind in P2P else rng.randrange(len(groups))
        dtype = rng.choice(DTYPES)
        op = rng.choice(FLOAT_OPS if dtype.is_floating_point else INT_OPS) if kind in REDUCING else "SUM"
        if op == "AVG" and len(groups[group]) not in (1, 2, 4, 8):  # sum / n exact only for powers of two
            op = "SUM"
        steps.append(Step(index=index, kind=kind, group=group, dtype=dtype,
                          numel=rng.choices(NUMELS, NUMEL_WEIGHTS)[0], op=op, root=rng.randrange(8),
                          tag=rng.choice(TAGS) if tags else 0, is_async=rng.random() < ASYNC_SHARE))
    return steps


def value(step: Step, sender: int, i: int) -> int:
    """Element ``i`` of what global rank ``sender`` contributes to ``step``: an integer whose reduction over up
    to 8 ranks by the step's op the step's dtype holds exactly (|v| <= 30 for floats, <= 7 for int8, 0..7 for
    uint8, int32 and int64 shifted by OFFSETS; for PRODUCT 1, -1 and, from the first four ranks only, 2 and -2:
    every product within 16)."""
    base = (step.index * 37 + sender * 11 + i * 5) % 61 - 30
    if step.op == "PRODUCT":
        factor = (1, -1, 2, -2)[base % (4 if sender < 4 else 2)]
        return abs(factor) if step.dtype == torch.uint8 else factor
    if step.dtype == torch.int8:
        return base // 4
    if step.dtype == torch.uint8:
        return (base + 30) // 8
    return base + OFFSETS.get(step.dtype, 0) * (sender % 3 - 1)


def refusal_words(op: str | None, dtype: torch.dtype) -> tuple[str, ...]:
    """What a refusal of a step must name: that the op is unsupported, the op where it is one some backends lack
    (PRODUCT, AVG and the bitwise ones: gloo's 'Cannot use ReduceOp.AVG with Gloo'), or the dtype by a name no
    other error carries by chance (not 'Int' or 'Long')."""
    words = [*UNSUPPORTED, dtype_name(dtype)]
    if op not in (None, "SUM", "MIN", "MAX"):
        words.append(f"ReduceOp.{op}")
        words.append(op)
    return (*words, *{torch.bfloat16: ("BFloat16",), torch.float16: ("Half",)}.get(dtype, ()))


def sentinel(dtype: torch.dtype) -> int:
    """SENTINEL in ``dtype`` (255 for uint8, which has no -99): never a value a step sends or computes."""
    return 255 if dtype == torch.uint8 else SENTINEL


FOLDS: dict[str, Callable[[list[int]], float]] = {
    "SUM": sum, "MIN": min, "MAX": max, "AVG": lambda col: sum(col) / len(col),
    "PRODUCT": lambda col: functools.reduce(operator.mul, col),
    "BAND": lambda col: functools.reduce(operator.and_, col), "BOR": lambda col: functools.reduce(operator.or_, col),
    "BXOR": lambda col: functools.reduce(operator.xor, col),
}


def _reduce(op: str, columns: list[list[int]]) -> list[float]:
    """The exact reduction by ``op`` of the members' inputs (one list each), element by element."""
    return [FOLDS[op](list(col)) for col in zip(*columns)]


@dataclass
class Watched:
    """A tensor a step passes to the backend: a view GUARD elements into a buffer whose other elements hold
    SENTINEL; ``want``: the values the view must hold (None: unspecified), ``what`` names it."""

    view: torch.Tensor
    buffer: torch.Tensor
    want: list[int] | None
    what: str

    def problem(self) -> str | None:
        """What is wrong with it now, or None."""
        count = self.view.numel()
        guards = torch.cat([self.buffer[:GUARD], self.buffer[GUARD + count:]])
        unset = sentinel(self.buffer.dtype)
        if bool((guards != unset).any()):
            return (f"{self.what}: the backend wrote outside the tensor it was given (a view at offset {GUARD} "
                    f"of {count} elements): the elements around it were {unset}, observed "
                    f"{self.buffer[:GUARD].tolist()} before it and {self.buffer[GUARD + count:].tolist()} after")
        if self.want is None:
            return None
        return None if (diff := mismatch(self.view, self.want, self.view.dtype)) is None else f"{self.what}: {diff}"


@dataclass
class Issued:
    """An op issued by this rank: its step, its Works (none once settled) and the tensors to check."""

    step: Step
    works: list[Any]
    watched: list[Watched]
    arrivals: list[str]  # a barrier's: the check-store keys its members set just before entering it


def _late(ctx: CheckContext, issued: Issued) -> str | None:
    """For a barrier that returned (or whose wait did): the members that had not yet entered it, if any."""
    late = [key.rsplit("/", 1)[1] for key in issued.arrivals if not ctx.store.check([key])]
    return f"it returned before members {late} had entered it (each sets a key in the check's store first)" \
        if late else None


def issue(ctx: CheckContext, step: Step, group: Any, members: list[int], what: str, run: str) -> Issued | None:
    """Issue ``step`` (``what`` describes it; ``run`` names this run of its program) on this rank, a member of its
    group; None when the target declines its kind. Every tensor it passes is a guarded view (``Watched``):
    outputs must hold what the op gives, inputs their own values; a barrier's members must all have entered it."""
    r, dev, k, n = ctx.rank, ctx.device, step.numel, len(members)
    me = members.index(r)
    watched: list[Watched] = []
    arrivals: list[str] = []

    def sent(sender: int, count: int, start: int = 0) -> list[int]:
        return [value(step, sender, start + i) for i in range(count)]

    def tensor(count: int, holds: list[int] | None, want: list[int] | None, what: str) -> torch.Tensor:
        buffer = torch.full((count + 2 * GUARD,), sentinel(step.dtype), dtype=step.dtype, device=dev)
        view = buffer[GUARD:GUARD + count]
        if holds is not None:
            view.copy_(torch.tensor(holds, dtype=step.dtype))
        watched.append(Watched(view, buffer, want, what))
        return view

    def source(count: int) -> torch.Tensor:  # this rank's input, which the op must leave as it was
        return tensor(count, sent(r, count), sent(r, count), "the input")

    def output(want: list[int], what: str = "the output") -> torch.Tensor:
        return tensor(len(want), None, want, what)

    call: Callable[[], Any]
    flag = {"async_op": step.is_async, "group": group}
    root = members[step.root % n]
    reduce_op = getattr(dist.ReduceOp, step.op)
    if step.kind == "all_reduce":
        t = tensor(k, sent(r, k), _reduce(step.op, [sent(m, k) for m in members]), "the tensor")
        call = lambda: dist.all_reduce(t, op=reduce_op, **flag)  # noqa: E731
    elif step.kind == "broadcast":
        t = tensor(k, sent(r, k), sent(root, k), f"the tensor (from {root})")
        call = lambda: dist.broadcast(t, src=root, **flag)  # noqa: E731
    elif step.kind == "reduce":  # what non-roots hold afterwards is unspecified
        t = tensor(k, sent(r, k), _reduce(step.op, [sent(m, k) for m in members]) if r == root else None,
                   f"the tensor (root {root})")
        call = lambda: dist.reduce(t, dst=root, op=reduce_op, **flag)  # noqa: E731
    elif step.kind == "all_gather_into_tensor":
        t, out = source(k), output([v for m in members for v in sent(m, k)])
        call = lambda: dist.all_gather_into_tensor(out, t, **flag)  # noqa: E731
    elif step.kind == "reduce_scatter_tensor":
        t, out = source(n * k), output(_reduce(step.op, [sent(m, k, me * k) for m in members]))
        call = lambda: dist.reduce_scatter_tensor(out, t, op=reduce_op, **flag)  # noqa: E731
    elif step.kind == "all_to_all_single":
        t, out = source(n * k), output([v for m in members for v in sent(m, k, me * k)])
        call = lambda: dist.all_to_all_single(out, t, **flag)  # noqa: E731
    elif step.kind == "all_gather":
        t, outs = source(k), [output(sent(m, k), f"the tensor from {m}") for m in members]
        call = lambda: dist.all_gather(outs, t, **flag)  # noqa: E731
    elif step.kind == "gather":
        t = source(k)
        got = [output(sent(m, k), f"the tensor from {m} (root {root})") for m in members] if r == root else None
        call = lambda: dist.gather(t, gather_list=got, dst=root, **flag)  # noqa: E731
    elif step.kind == "scatter":
        chunks = [tensor(k, sent(r, k, j * k), sent(r, k, j * k), f"the chunk for {m}")
                  for j, m in enumerate(members)] if r == root else None
        out = output(sent(root, k, me * k), f"the chunk from {root}")
        call = lambda: dist.scatter(out, scatter_list=chunks, src=root, **flag)  # noqa: E731
    elif step.kind == "barrier":
        arrivals = [f"program-barrier/{run}/{step.index}/{m}" for m in members]

        def call() -> Any:
            ctx.store.set(arrivals[me], "entered")
            return dist.barrier(**flag)
    elif step.kind == "pair":  # the first member sends to the last, which receives it by name
        first, last = members[0], members[-1]
        p2p = dist.isend if step.is_async else dist.send
        if r == first:
            t = source(k)
            call = lambda: p2p(t, dst=last, group=group, tag=step.tag)  # noqa: E731
        else:
            out = output(sent(first, k), f"the tensor from {first}") if r == last else None
            get = dist.irecv if step.is_async else dist.recv
            call = (lambda: get(out, src=first, group=group, tag=step.tag)) if out is not None else (
                lambda: None)
    elif step.kind == "coalesced":  # two all_reduces (the step's op) in one _coalescing_manager block
        ts = [tensor(k + j, sent(r, k + j, j), _reduce(step.op, [sent(m, k + j, j) for m in members]),
                     f"tensor {j} of the block") for j in range(2)]

        def call() -> Any:
            with dist._coalescing_manager(group=group, async_ops=step.is_async) as manager:
                for t in ts:
                    dist.all_reduce(t, op=reduce_op, group=group)
            return manager.works if step.is_async else None
    else:  # ring: send to the next member, receive from the previous one, in one batch
        nxt, prev = members[(me + 1) % n], members[(me - 1) % n]
        t, out = source(k), output(sent(prev, k), f"the tensor from {prev}")
        ops = [dist.P2POp(dist.isend, t, nxt, group=group, tag=step.tag),
               dist.P2POp(dist.irecv, out, prev, group=group, tag=step.tag)]
        call = lambda: dist.batch_isend_irecv(ops)  # noqa: E731
    works: list[Any] = []

    def run() -> None:
        result = call()
        works.extend(result if isinstance(result, list) else [result] if result is not None else [])
        if step.kind == "pair" and not step.is_async:
            works.clear()  # send and recv have returned: done

    reduces = step.op if step.kind in REDUCING else None
    support = f"program: {step.kind} {reduces or ''} {dtype_name(step.dtype)}"
    if not optional_case(ctx, f"program step {what}", run, refusal_words(reduces, step.dtype), kind=support):
        return None
    if not step.is_async:
        for work in works:  # batch_isend_irecv's works, which a sync ring waits at once
            finish_work(ctx, step.kind, work)
        works.clear()
    return Issued(step, works, watched, arrivals)


Failure = tuple[int, str]  # (the step's index in the drawn program, what was wrong)


def run_program(ctx: CheckContext, steps: list[Step], groups: list[list[int]], handles: list[Any],
                wait_seed: int) -> list[Failure]:
    """Run ``steps`` on this rank; the failures it saw, in the order seen. A backend error ends the run: it is
    raised (the members may no longer agree on what comes next)."""
    rng = random.Random(stable_seed(wait_seed, ctx.rank))
    run = ctx.agreements.get("program/run", 0)  # every rank runs programs alike: the same count everywhere
    ctx.agreements["program/run"] = run + 1
    failures: list[Failure] = []
    pending: list[Issued] = []
    done: list[Issued] = []

    def judge(issued: Issued, when: str) -> None:
        problems = [w.problem() for w in issued.watched] + [_late(ctx, issued)]
        failures.extend((issued.step.index, f"rank {ctx.rank}: {issued.step.describe(groups)}, {when}: {problem}")
                        for problem in problems if problem is not None)

    def settle(issued: Issued, when: str) -> None:
        for work in issued.works:
            finish_work(ctx, issued.step.describe(groups), work)
        judge(issued, when)
        done.append(issued)

    for step in steps:
        members = groups[step.group]
        if ctx.rank in members:
            issued = issue(ctx, step, handles[step.group], members, step.describe(groups), str(run))
            if issued is not None and not step.is_async:
                settle(issued, "when the call returned")
            elif issued is not None:
                pending.append(issued)
        while pending and rng.random() < WAIT_SHARE:
            settle(pending.pop(rng.randrange(len(pending))), f"after wait() (step #{step.index} issued last)")
    rng.shuffle(pending)
    for issued in pending:
        settle(issued, "after wait() at the program's end")
    if not failures:
        for issued in done:  # a later op must not have written into an earlier one's output
            judge(issued, "at the program's end, after the later steps")
    return failures


@dataclass
class Outcome:
    """How a program went on every rank: the statuses agreed through the store, the position (in the program
    run) of the first step that failed on any rank, and what this rank saw."""

    statuses: list[str]
    first: int
    seen: list[str]

    @property
    def failed(self) -> bool:
        return "mismatch" in self.statuses and RAISED not in self.statuses


def judge_program(ctx: CheckContext, steps: list[Step], groups: list[list[int]], handles: list[Any],
                  wait_seed: int, topic: str) -> Outcome:
    """Run ``steps`` and agree with every rank on the outcome. A backend error (or a refusal that breaks the
    optional-op rule) is RAISED: no further program or candidate runs."""
    try:
        failures = run_program(ctx, steps, groups, handles, wait_seed)
        status = "mismatch" if failures else "ok"
        seen = [message for _, message in failures]
    except Exception as exc:  # noqa: BLE001 - every rank stops on it, as Findings does
        status, failures, seen = RAISED, [], [str(exc) if isinstance(exc, CheckFailed)
                                                else f"rank {ctx.rank}: raised {type(exc).__name__}: {exc}"]
    positions = {s.index: p for p, s in enumerate(steps)}
    mine = min((positions[i] for i, _ in failures), default=len(steps))
    answers = [a.split(":") for a in agree(ctx, list(range(ctx.world_size)), topic, f"{status}:{mine}")]
    return Outcome([a[0] for a in answers], min(int(a[1]) for a in answers), seen)


def shrink(ctx: CheckContext, steps: list[Step], outcome: Outcome, groups: list[list[int]], handles: list[Any],
           wait_seed: int, topic: str) -> tuple[list[Step], list[str]]:
    """The shortest still-failing program found from ``steps`` (which failed: ``outcome``) and what this rank saw
    in it: every step made sync, then the program cut after its first failing step, then each step before that
    one removed in turn (nearest first); every candidate judged by every rank, at most MAX_SHRINK_STEPS of them.
    Stops at a candidate that raised anywhere."""
    best, seen = steps, outcome.seen

    def attempt(candidate: list[Step]) -> Outcome | None:
        result = judge_program(ctx, candidate, groups, handles, wait_seed, topic)
        return result if result.failed else None

    tries = 1
    synced = attempt([replace(s, is_async=False) for s in steps])
    if synced is not None:
        best, outcome, seen = [replace(s, is_async=False) for s in steps], synced, synced.seen
    cut = best[:outcome.first + 1]
    position = len(cut) - 2  # the step before the first failing one
    if len(cut) < len(best):
        tries += 1
        if (result := attempt(cut)) is not None:
            best, seen = cut, result.seen
    while position >= 0 and tries < MAX_SHRINK_STEPS:
        candidate = best[:position] + best[position + 1:]
        tries += 1
        if (result := attempt(candidate)) is not None:
            best, seen = candidate, result.seen
        position -= 1
    return best, seen


def offered_kinds(ctx: CheckContext, world: Any) -> tuple[str, ...]:
    """The kinds the target runs: each tried once on the world (one float32 element, sync, judged like any
    step); a kind refused naming it (``optional_case``) on any rank is left out of every program."""
    members = list(range(ctx.world_size))
    refused = []
    for number, kind in enumerate(KINDS):
        if kind in P2P and len(members) < 2:
            continue
        step = Step(index=-1 - number, kind=kind, group=0, dtype=torch.float32, numel=1, op="SUM", root=0, tag=0,
                    is_async=False)
        issued = issue(ctx, step, world, members, f"{kind} on the world (is it offered?)", "offered")
        problems = [p for p in ([w.problem() for w in issued.watched] + [_late(ctx, issued)] if issued else [])
                    if p is not None]
        if problems:
            raise CheckFailed(f"rank {ctx.rank}: {kind} of one float32 element on the world: {problems[0]}")
        if issued is None:
            refused.append(kind)
    answers = agree(ctx, members, "program/offered", ",".join(refused))
    left_out = {k for answer in answers for k in answer.split(",") if k}
    return tuple(k for k in KINDS if k not in left_out and (k not in P2P or len(members) > 1))


def check_programs(ctx: CheckContext) -> None:
    """Run the run's programs on the world and every group of ``program_partitions``; fail naming the seed and
    the smallest failing program found."""
    generation, n = ctx.generation, ctx.world_size
    groups: list[list[int]] = [list(range(n))]
    handles: list[Any] = [dist.group.WORLD]
    for parts in program_partitions(n):
        groups.extend(parts)
        handles.extend(make_partition(ctx, parts))
    tags = "p2p_tags" in ctx.target.capabilities
    count = PROGRAMS + max(0, generation.budget - 2)
    offered = offered_kinds(ctx, handles[0])
    kinds: dict[str, int] = {}
    for number in range(count):
        steps = draw_program(generation.seed, number, groups, tags, offered)
        for step in steps:
            kinds[step.kind] = kinds.get(step.kind, 0) + 1
        wait_seed = stable_seed(generation.seed, "waits", number)
        topic = f"program/{number}"
        outcome = judge_program(ctx, steps, groups, handles, wait_seed, topic)
        where = f"program {number} (seed {generation.seed}; reproduce with {generation.reproduce()})"
        if RAISED in outcome.statuses:
            if outcome.seen and outcome.statuses[ctx.rank] == RAISED:
                raise CheckFailed(f"{where}: {outcome.seen[0]}; the program: "
                                  + "; ".join(s.describe(groups) for s in steps))
            raise CheckFailed(f"rank {ctx.rank}: {where}: another rank's backend raised (its error names it); "
                              "this rank stopped there")
        if outcome.failed:
            small, seen = shrink(ctx, steps, outcome, groups, handles, wait_seed, topic)
            # every rank names what the ranks that saw a failure saw (through the store, not the backend)
            shown = " | ".join(m for m in agree(ctx, list(range(n)), f"{topic}/seen", seen[0] if seen else "") if m)
            raise CheckFailed(f"{where} failed; smallest failing program found, {len(small)} of {len(steps)} steps: "
                              + "; ".join(s.describe(groups) for s in small) + f": {shown}")
    if ctx.rank == 0:
        ctx.note(f"generated programs: {count} of {STEPS} steps on {len(groups)} groups (seed {generation.seed}); "
                 "steps per kind: " + ", ".join(f"{k} {kinds.get(k, 0)}" for k in KINDS))
