"""Checks for P2P communicator reuse and P2P data semantics."""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import collective_cases as cc
from conformance.checks import p2p_cases, warned
from conformance.checks import reference as ref
from conformance.checks.cases import stable_seed
from conformance.checks.common import (
    LONG_RUN,
    LONG_RUN_LATE_S,
    Findings,
    Needle,
    default_mode,
    expect_exact,
    expect_raises,
    expect_refusal,
    finish_work,
    new_comms,
    positive_control,
    post,
    ranked_tensor,
    ranked_values,
    refusal_words,
    require_fields,
    sweep_groups,
    world_comm,
)
from conformance.checks.generated import agree, raise_shared, run_plan
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed, NotObservable, Skipped
from conformance.probe import observing
from conformance.torch_compat import PAIR_P2P_STACKS


def _exchange(ctx: CheckContext, pairs: list[tuple[int, int]], salt: int,
              group: dist.ProcessGroup | None = None) -> None:
    """For each (src, dst) pair, src sends a tensor naming itself; dst checks what arrived."""
    works, inbox = [], []
    for src, dst in pairs:
        if src == ctx.rank:
            works.append(dist.isend(ranked_tensor(ctx, salt=salt), dst, group=group))
        if dst == ctx.rank:
            buf = torch.zeros(8, device=ctx.device)
            works.append(dist.irecv(buf, src, group=group))
            inbox.append((src, buf))
    for work in works:
        work.wait()
    for src, buf in inbox:
        expected = ranked_values(src, salt=salt)
        bad = ref.mismatch(buf, expected, buf.dtype)
        ctx.expect(bad is None, f"data received from rank {src} (salt {salt})", expected, bad)


def ring(n: int) -> list[tuple[int, int]]:
    """Each rank sends to its successor."""
    return [(r, (r + 1) % n) for r in range(n)]


def all_pairs(n: int) -> list[tuple[int, int]]:
    """Every ordered pair of distinct ranks."""
    return [(a, b) for a in range(n) for b in range(n) if a != b]


def one_f_one_b(ctx: CheckContext, microbatches: int = 4) -> None:
    """A pipeline schedule: stage r receives activations from r-1, sends to r+1; gradients go back."""
    n, r = ctx.world_size, ctx.rank
    act = torch.zeros(8, device=ctx.device)
    for mb in range(microbatches):
        if r > 0:
            dist.recv(act, r - 1)
            ctx.expect_equal(f"1F1B forward activation {mb} from stage {r - 1}", float(mb * 10 + r - 1), act[0].item())
        if r < n - 1:
            dist.send(torch.full((8,), float(mb * 10 + r), device=ctx.device), r + 1)
    for mb in range(microbatches):
        if r < n - 1:
            dist.recv(act, r + 1)
            ctx.expect_equal(f"1F1B backward gradient {mb} from stage {r + 1}", float(-mb - r - 1), act[0].item())
        if r > 0:
            dist.send(torch.full((8,), float(-mb - r), device=ctx.device), r - 1)


@check("P2P-EAGER-REUSE")
def eager_reuse(ctx: CheckContext) -> None:
    """Eager init: P2P schedules create no communicator beyond the group's own."""
    ctx.init_world("eager")
    dist.barrier()
    if not ctx.probe.events("comm_created"):  # positive control: the probe sees the world's own communicator
        raise NotObservable(f"target {ctx.target.name}'s probe recorded no communicator, not even the one eager "
                            "init made for the world: it cannot show that P2P makes none")
    since = ctx.probe.mark()
    words = ctx.target.traits.lazy_p2p_warning
    with stderr_lines(ctx.target.traits.warnings_on_stderr) as err, warned.recorded() as caught:
        _exchange(ctx, all_pairs(ctx.world_size), salt=1)
        _exchange(ctx, ring(ctx.world_size), salt=2)
        one_f_one_b(ctx)
    created = new_comms(ctx, since)
    _recorder_sees_lazy_warning(ctx, words)
    shown, hidden = warned.matching(caught, lambda m: is_lazy_p2p_warning(m, words))
    spurious = shown + hidden + [m for m in err if is_lazy_p2p_warning(m, words)]
    ctx.expect(not spurious, "lazy-P2P warnings during P2P on an eagerly initialised world (its communicator "
               "carries P2P: nothing to warn about)", "none", spurious[:2])
    launches = [e for e in ctx.probe.events("launch", since) if e["op"] in ("send", "recv")]
    # positive controls: the probe saw the world communicator's creation and the P2P launches themselves
    world = world_comm(ctx)
    positive_control(ctx, bool(launches), "the P2P launches of this schedule")
    ctx.expect(not created, "communicators created by P2P under eager init", "none",
               [(e["comm"], e["members"], e["mode"]) for e in created])
    require_fields(ctx, launches, "comm")
    # a non-cooperative probe knows the group a launch was issued on, not the backend's communicator id:
    # a launch whose group is the world's counts as the world's (its communicators are the backend's to report)
    elsewhere = sorted({e["comm"] for e in launches if e["comm"] != world["comm"]
                        and (e.get("group") is None or e.get("group") != world.get("group"))})
    ctx.expect(not elsewhere, f"communicators carrying P2P under eager init (the world's is {world['comm']})",
               "the world communicator only", elsewhere)
    _one_op_each(ctx, launches)


def _recorder_sees_lazy_warning(ctx: CheckContext, words: tuple[str, ...] | None) -> None:
    """The positive control of the eager world's 'no lazy-P2P warning': the same recording (Python warnings, and
    fd 2 where the target's warnings go there) and the same matcher see a warning of the target's lazy-P2P words
    raised in the check's own process."""
    sample = " ".join(words) if words else "lazy P2P: bind a device with device_id to reuse the communicator"
    on_stderr = ctx.target.traits.warnings_on_stderr
    with stderr_lines(on_stderr) as err, warned.recorded() as caught:
        warnings.warn(sample, UserWarning, stacklevel=1)
        if on_stderr:
            os.write(2, f"{sample}\n".encode())
    seen, _ = warned.matching(caught, lambda m: is_lazy_p2p_warning(m, words))
    printed = [m for m in err if is_lazy_p2p_warning(m, words)]
    positive_control(ctx, bool(seen) and (bool(printed) or not on_stderr),
                     "a lazy-P2P warning raised (and printed to fd 2) in the check's process")


def _one_op_each(ctx: CheckContext, launches: list[dict]) -> None:
    """Each unbatched send or recv is a launch of one op (probes/README.md: ``ops``, the number of ops in the
    launch; every probe here fills it: the simulator's, the dispatcher's and the flight recorder's)."""
    require_fields(ctx, launches, "ops")
    wrong = sorted({(e["op"], e["ops"]) for e in launches if e["ops"] != 1})
    ctx.expect(not wrong, "ops of each unbatched send/recv launch", 1, wrong)


def _expect_declared_pairs(ctx: CheckContext, what: str) -> None:
    """A target that declares ``lazy_pair_comms`` fails where lazy P2P made no pair communicator (its probe has
    shown the world's communicator being made: the caller's positive control), rather than not applying."""
    ctx.expect("lazy_pair_comms" not in ctx.target.capabilities,
               f"{what}, on a target declaring lazy_pair_comms", "one 2-rank communicator per pair", "none")


@check("P2P-LAZY-PAIR-COMM")
def lazy_pair_comm(ctx: CheckContext) -> None:
    """Lazy init: one 2-rank communicator per unordered pair, created on first use, reused."""
    ctx.init_world("lazy")
    since = ctx.probe.mark()
    for salt in range(3):
        _exchange(ctx, ring(ctx.world_size), salt=salt)
    _exchange(ctx, all_pairs(ctx.world_size), salt=9)
    created = new_comms(ctx, since)
    _around_first_collective(ctx)  # after `created`: its all_reduce makes a group communicator
    if "p2p_any_source" in ctx.target.capabilities:  # a lazy group's any-source receive (its barrier makes the
        _any_source_then_named(ctx)                  # group's own communicator: counted after `created`)
    if not created:
        dist.barrier()  # makes a lazy world's own communicator where nothing above did: the positive control
        positive_control(ctx, bool(ctx.probe.events("comm_created")), "the world's communicator being made")
        stack = ctx.target.target.stack
        ctx.expect(stack not in PAIR_P2P_STACKS, f"communicators made by lazy P2P on stack {stack}, which sends on "
                   "one 2-rank communicator per peer pair", "one per pair", "none")
        _expect_declared_pairs(ctx, "communicators made by lazy P2P (ring, all-pairs)")
        raise Skipped(f"target {ctx.target.name} made no communicator for lazy P2P (its group communicator "
                      "serves P2P): the requirement applies to backends that make pair communicators")
    require_fields(ctx, created, "members", "mode")
    pairs: dict[tuple[int, ...], list[str]] = {}
    for event in created:
        ctx.expect_equal(f"creation mode of communicator {event['comm']} made by P2P", "p2p", event["mode"])
        pairs.setdefault(tuple(event["members"]), []).append(event["comm"])
    peers = sorted({tuple(sorted((ctx.rank, p))) for p in range(ctx.world_size) if p != ctx.rank})
    ctx.expect_equal("unordered pairs that got a communicator", peers, sorted(pairs))
    many = {k: v for k, v in pairs.items() if len(v) != 1}
    ctx.expect(not many, "communicators per unordered pair", 1, many)
    ids = [e["comm"] for e in created]  # one communicator per pair, each its own: two pairs' under one id are not
    ctx.expect(len(set(ids)) == len(ids), "ids of the pair communicators lazy P2P made", "one per pair", ids)
    _pair_ids_agree(ctx, created)
    _pairs_of_another_group(ctx, set(ids))
    _first_p2p_by_entry_point(ctx)


def _pair_ids_agree(ctx: CheckContext, created: list[dict[str, Any]]) -> None:
    """A pair communicator is one communicator of two ranks: both record it under the same id (NCCL's commId, the
    hash of the communicator's unique id, is the same on every member; ProcessGroupNCCL keys it by the pair,
    'low:high', on both). Each rank's ids by pair are compared with its peer's, through the check's store: the
    event's ``comm_hash`` where the probe records one (NCCL's log: its ``comm`` is a per-process pointer), else
    its ``comm``."""
    mine = {"-".join(map(str, sorted(e["members"]))): e.get("comm_hash") or e["comm"] for e in created}
    every = [json.loads(v) for v in agree(ctx, list(range(ctx.world_size)), "pair-comm-ids", json.dumps(mine))]
    for pair, comm in sorted(mine.items()):
        peer = next(int(m) for m in pair.split("-") if int(m) != ctx.rank)
        ctx.expect_equal(f"id of pair communicator {pair} as rank {peer} records it (this rank: {comm})", comm,
                         every[peer].get(pair))


SENDER_LATE_S = 0.2  # how long a sender waits before sending what a posted receive waits for


def _around_first_collective(ctx: CheckContext) -> None:
    """On a new lazy group of every rank, a ring of messages, then the group's first collective (an all_reduce,
    which makes the group's communicator where the backend makes one then), then a message from rank 0 to rank 1
    whose receive is posted ``SENDER_LATE_S`` before it is sent: each message exact, the all_reduce's sum too.
    A backend that numbers or keys messages afresh once the group has its communicator, while the first ring's
    are still where it keeps them, hands a receive an old message."""
    if ctx.world_size < 2:
        return
    group = ctx.new_group(list(range(ctx.world_size)))
    _exchange(ctx, ring(ctx.world_size), salt=21, group=group)
    total = torch.full((2,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(total, group=group)
    n = ctx.world_size
    expect_exact(ctx, total, [float(n * (n + 1) // 2)] * 2, "all_reduce SUM of a new lazy group between two rings "
                 "of its messages")
    failure = ""
    if ctx.rank == 0:  # one direction only: a recv and a send crossing on one pair's stream deadlock on NCCL
        time.sleep(SENDER_LATE_S)
        dist.send(ranked_tensor(ctx, salt=22), 1, group=group)
    elif ctx.rank == 1:
        got = torch.zeros(8, device=ctx.device)
        dist.recv(got, 0, group=group)
        expected = ranked_values(0, salt=22)
        bad = ref.mismatch(got, expected, got.dtype)
        if bad is not None:
            failure = (f"rank 1: a new lazy group's message from rank 0 after the group's first collective (the "
                       f"receive posted {SENDER_LATE_S} s before the send): expected {expected}, observed {bad}")
    raise_shared(ctx, "p2p-after-first-collective", failure, 1)  # a sender whose message was not taken may wait


# (the sender's call, the receiver's call) of a new lazy group's first message: every way torch hands unbatched P2P
# to a backend (a batch is judged apart: _first_batch)
ENTRY_POINTS = (("send", "recv"), ("isend", "irecv"), ("send", "recv(src=None)"))


def _ring_batch(ctx: CheckContext, group: Any, salt: int) -> str:
    """Every rank sends its successor a tensor and receives its predecessor's in one batch_isend_irecv on
    ``group`` (of every rank), to completion; a problem with the data, or ''. Every rank takes part: torch allows a
    batch as a group's first op only so (batch_isend_irecv's docstring, v2.13.0 distributed_c10d.py:3031-3036:
    ProcessGroupNCCL runs a batch on the group's communicator, making it then)."""
    n, r = ctx.world_size, ctx.rank
    got = torch.zeros(8, device=ctx.device)
    ops = [dist.P2POp(dist.isend, ranked_tensor(ctx, salt=salt), (r + 1) % n, group=group),
           dist.P2POp(dist.irecv, got, (r - 1) % n, group=group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    want = ranked_values((r - 1) % n, salt=salt)
    bad = ref.mismatch(got, want, got.dtype)
    return "" if bad is None else f"the data from rank {(r - 1) % n}: expected {want}, observed {bad}"


def batch_design(ctx: CheckContext, made: list[dict[str, Any]]) -> tuple[str, str]:
    """What a new lazy group's first batch (a ring, ``_ring_batch``) made on this rank: ('pairs', '') where it made
    the 2-rank communicators of this rank's ring pairs, ('group', '') where it made one communicator of every rank
    and no pair one (ProcessGroupNCCL: a batch's P2P is keyed by the device, as a collective, pointToPoint's
    batchP2P branch), else ('', the problem)."""
    n, r = ctx.world_size, ctx.rank
    pairs = sorted(tuple(e["members"]) for e in made if e.get("mode") == "p2p")
    whole = [e for e in made if e.get("mode") != "p2p" and sorted(e.get("members") or []) == list(range(n))]
    ring_pairs = sorted({tuple(sorted((r, p))) for p in ((r + 1) % n, (r - 1) % n)})
    if pairs == ring_pairs and not whole:
        return "pairs", ""
    if not pairs and len(whole) == 1:
        return "group", ""
    seen = [(e.get("mode"), e.get("members")) for e in made]
    return "", (f"communicators made on rank {r}: expected the 2-rank ones of its ring pairs {ring_pairs}, or one "
                f"of every rank and no pair one, observed (mode, members) {seen}")


def _first_batch(ctx: CheckContext) -> list[str]:
    """A new lazy group of every rank whose first op is a ring in one batch_isend_irecv: exact data, and on each
    rank either the pair communicators of its ring pairs or the group's own communicator (``batch_design``)."""
    group = ctx.new_group(list(range(ctx.world_size)))
    since = ctx.probe.mark()
    what = f"rank {ctx.rank}: a new lazy group whose first op is a ring in one batch_isend_irecv"
    try:
        problem = _ring_batch(ctx, group, salt=31)
    except Exception as exc:  # noqa: BLE001 - named below; the ranks still meet at the barrier
        problem = f"{type(exc).__name__}: {exc}"
    problems = [f"{what}: {problem}"] if problem else []
    _, wrong = batch_design(ctx, new_comms(ctx, since))
    if wrong:
        problems.append(f"{what}: {wrong}")
    dist.barrier()
    return problems


def _first_p2p_by_entry_point(ctx: CheckContext) -> None:
    """In a new lazy group of every rank, rank 0's first message to rank 1 goes through each unbatched entry point
    in turn (send/recv, isend/irecv, and recv(src=None) where the target receives from any source): whichever call
    it is, both ranks make the pair's communicator then (one, of ranks 0 and 1), the others none, and the message
    arrives exact. A receive from any source does not know its sender, so its rank may also make communicators
    with its other peers (one per pair, each its own). Then a new lazy group's first batch (``_first_batch``)."""
    problems: list[str] = _first_batch(ctx)
    for sender, receiver in ENTRY_POINTS:
        if receiver == "recv(src=None)" and "p2p_any_source" not in ctx.target.capabilities:
            continue
        group = ctx.new_group(list(range(ctx.world_size)))
        since = ctx.probe.mark()
        what = f"rank {ctx.rank}: a new lazy group's first message, rank 0 by {sender} to rank 1 by {receiver}"
        want = [float(7 * k + 3) for k in range(4)]
        try:
            if ctx.rank == 0:
                _entry_call(sender, torch.tensor(want, device=ctx.device), 1, group, sending=True)
            elif ctx.rank == 1:
                got = torch.zeros(4, device=ctx.device)
                _entry_call(receiver, got, 0, group, sending=False)
                bad = ref.mismatch(got, want, got.dtype)
                if bad is not None:
                    problems.append(f"{what}: the data received: expected {want}, observed {bad}")
        except Exception as exc:  # noqa: BLE001 - named below; the ranks still meet at the barrier
            problems.append(f"{what}: {type(exc).__name__}: {exc}")
        made = sorted(tuple(e["members"]) for e in new_comms(ctx, since) if e.get("mode") == "p2p")
        if ctx.rank == 1 and receiver == "recv(src=None)":
            ok = (0, 1) in made and len(set(made)) == len(made) and all(1 in pair for pair in made)
            want_pairs = "[(0, 1)] and at most one more pair of rank 1 with each other peer"
        else:
            want_pairs = str([(0, 1)] if ctx.rank in (0, 1) else [])
            ok = str(made) == want_pairs
        if not ok:
            problems.append(f"{what}: pair communicators made on rank {ctx.rank}: expected {want_pairs}, "
                            f"observed {made}")
        dist.barrier()
    if problems:
        raise CheckFailed("; ".join(problems))


def _entry_call(call: str, tensor: torch.Tensor, peer: int, group: Any, sending: bool) -> None:
    """Send ``tensor`` to, or receive it from, ``peer`` (a global rank) on ``group`` by ``call``, to completion."""
    if call == "recv(src=None)":
        dist.recv(tensor, src=None, group=group)
    else:
        _p2p_call(call, tensor, peer, group)


def _pairs_of_another_group(ctx: CheckContext, world_ids: set[str]) -> None:
    """A second lazy group of the same ranks (new_group of every rank) makes pair communicators of its own for its
    ring: one per unordered pair, none of them the world's (ProcessGroupNCCL keeps its communicators per process
    group, devNCCLCommMap_, so each group's first P2P with a peer makes one)."""
    group = ctx.new_group(list(range(ctx.world_size)))
    since = ctx.probe.mark()
    _exchange(ctx, ring(ctx.world_size), salt=5, group=group)
    made = [e for e in new_comms(ctx, since) if e.get("mode") == "p2p"]
    n, r = ctx.world_size, ctx.rank
    want = sorted({tuple(sorted((r, p))) for p in ((r + 1) % n, (r - 1) % n)})
    what = "a new_group of every rank after the world's P2P: pair communicators its ring made"
    ctx.expect_equal(f"{what}, by unordered pair", want, sorted(tuple(e["members"]) for e in made))
    reused = sorted(world_ids & {e["comm"] for e in made})
    ctx.expect(not reused, f"{what}: ids also made by the world's P2P", "none", reused)


@contextmanager
def stderr_lines(enabled: bool) -> Iterator[list[str]]:
    """While active, what the process writes to fd 2 (C++ included) goes to a file; the lines are
    appended to the yielded list on exit. Does nothing when ``enabled`` is False."""
    lines: list[str] = []
    if not enabled:
        yield lines
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", errors="replace").splitlines())


def is_lazy_p2p_warning(message: str, words: tuple[str, ...] | None) -> bool:
    """Whether ``message`` is the lazy-P2P warning: it contains every one of the target's ``words``
    (``Traits.lazy_p2p_warning``), or, for a target that names none, recommends a device binding."""
    if words:
        return all(w in message for w in words)
    low = message.lower()
    return "device" in low and ("bind" in low or "device_id" in message)


@check("P2P-LAZY-WARN-ONCE")
def lazy_warn_once(ctx: CheckContext) -> None:
    """Lazy init: one warning about the per-pair communicators P2P creates, never one per op.

    P2P runs on the world, then on a new_group of every rank. A target warns once per group (the default) or,
    where its backend promises only that, once per process (``Traits.lazy_p2p_warning_scope = "process"``:
    ProcessGroupNCCL's TORCH_WARN_ONCE, which c10 prints to stderr, so such a target also sets
    ``warnings_on_stderr`` and runs this check in fresh rank processes). A backend that makes no pair
    communicators (its group communicator serves P2P, as gloo's full mesh does) has nothing to warn about: the
    requirement does not apply, shown by a probe that saw the world's communicator being made.
    """
    ctx.init_world("lazy")
    words = ctx.target.traits.lazy_p2p_warning
    per_process = ctx.target.traits.lazy_p2p_warning_scope == "process"
    group = ctx.new_group(list(range(ctx.world_size)))
    since = ctx.probe.mark()
    counts: list[tuple[str, int]] = []
    for what, pg in (("the world", None), ("a new_group of every rank", group)):
        with stderr_lines(ctx.target.traits.warnings_on_stderr) as err, warned.recorded() as caught:
            for salt in range(3):
                _exchange(ctx, all_pairs(ctx.world_size), salt=salt, group=pg)
        shown, hidden = warned.matching(caught, lambda m: is_lazy_p2p_warning(m, words))
        warned.expect_shown(ctx, hidden, f"{what}: the lazy-P2P warning")
        counts.append((what, len(shown + [m for m in err if is_lazy_p2p_warning(m, words)])))
    if observing("comm_created") in ctx.target.capabilities and not any(
            e.get("mode") == "p2p" for e in new_comms(ctx, since)) and sum(n for _, n in counts) == 0:
        positive_control(ctx, bool(ctx.probe.events("comm_created")), "the world's communicator being made")
        _expect_declared_pairs(ctx, "communicators made by lazy P2P on the world and a new_group")
        raise Skipped(f"target {ctx.target.name} made no per-pair communicators for lazy P2P and warned nothing: "
                      "the requirement applies to backends that make them")
    rounds = f"over 3 rounds of P2P with {ctx.world_size - 1} peers"
    if per_process:
        ctx.expect_equal(f"lazy-P2P warnings in this process {rounds} on each of two groups", [1, 0],
                         [n for _, n in counts])
        ctx.note("the warning by entry point is not judged where the backend warns once per process")
        return
    for what, n in counts:
        ctx.expect_equal(f"{what}: lazy-P2P warnings {rounds}", 1, n)
    _warning_by_entry_point(ctx, words)
    _refused_before_first(ctx, words)


def _warning_by_entry_point(ctx: CheckContext, words: tuple[str, ...] | None) -> None:
    """In a new lazy group per P2P entry point (``ENTRY_POINTS``), rank 0 sends rank 1 two messages by it, and
    those are the group's only P2P: each of the two ranks makes the pair's communicator then, so each warns
    once, the sender and the receiver alike, whichever call it is. Then a new lazy group whose only P2P is two
    rings in batches (``_batch_warning``)."""
    problems: list[str] = _batch_warning(ctx, words)
    for sender, receiver in ENTRY_POINTS:
        if receiver == "recv(src=None)" and "p2p_any_source" not in ctx.target.capabilities:
            continue
        group = ctx.new_group(list(range(ctx.world_size)))
        what = f"rank {ctx.rank}: a new lazy group whose only P2P is rank 0's two messages by {sender} to rank 1 by " \
               f"{receiver}"
        with warned.recorded() as caught:
            try:
                for k in range(2):
                    if ctx.rank == 0:
                        _entry_call(sender, torch.full((2,), float(k), device=ctx.device), 1, group, sending=True)
                    elif ctx.rank == 1:
                        _entry_call(receiver, torch.zeros(2, device=ctx.device), 0, group, sending=False)
            except Exception as exc:  # noqa: BLE001 - named below; the ranks still meet at the barrier
                problems.append(f"{what}: {type(exc).__name__}: {exc}")
        seen, hidden = warned.matching(caught, lambda m: is_lazy_p2p_warning(m, words))
        if ctx.rank in (0, 1) and len(seen) != 1:
            problems.append(f"{what}: lazy-P2P warnings on rank {ctx.rank}: expected 1, observed {len(seen)}"
                            + (f" (and {hidden[:1]}, a category Python's default filters hide)" if hidden else ""))
        dist.barrier()
    if problems:
        raise CheckFailed("; ".join(problems))


def _batch_warning(ctx: CheckContext, words: tuple[str, ...] | None) -> list[str]:
    """A new lazy group of every rank whose only P2P is two rings, each in one batch_isend_irecv: where its first
    batch made pair communicators, each rank warns once; where it made the group's own communicator (as
    ProcessGroupNCCL does, pointToPoint's batchP2P branch, which does not warn), no rank warns (there is no pair
    communicator to warn about). Which it made is read from the probe in the same run (``batch_design``)."""
    group = ctx.new_group(list(range(ctx.world_size)))
    since = ctx.probe.mark()
    what = f"rank {ctx.rank}: a new lazy group whose only P2P is two rings in batch_isend_irecv"
    problems: list[str] = []
    with warned.recorded() as caught:
        for k in range(2):  # each ring on every rank, whatever the other did: no rank left waiting in one
            try:
                problem = _ring_batch(ctx, group, salt=32 + k)
            except Exception as exc:  # noqa: BLE001 - named below; the ranks still meet at the barrier
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                problems.append(f"{what}: ring {k}: {problem}")
    design, wrong = batch_design(ctx, new_comms(ctx, since))
    seen, hidden = warned.matching(caught, lambda m: is_lazy_p2p_warning(m, words))
    if wrong:
        problems.append(f"{what}: {wrong}")
    elif len(seen) != (1 if design == "pairs" else 0):
        made = "its ring pairs' communicators" if design == "pairs" else "the group's communicator, no pair one"
        problems.append(f"{what}: lazy-P2P warnings on rank {ctx.rank} (the batches made {made}): expected "
                        f"{1 if design == 'pairs' else 0}, observed {len(seen)}"
                        + (f" (and {hidden[:1]}, a category Python's default filters hide)" if hidden else ""))
    dist.barrier()
    return problems


@check("P2P-DATA")
def data(ctx: CheckContext) -> None:
    """P2P delivers exactly what was sent: dtypes, views, tags, any-source."""
    ctx.init_world(default_mode(ctx))
    n, r = ctx.world_size, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.uint8):
        out = (torch.arange(6) + r).to(dtype).to(ctx.device)
        got = torch.zeros(6, dtype=dtype, device=ctx.device)
        works = [dist.isend(out, nxt), dist.irecv(got, prv)]
        for w in works:
            w.wait()
        want = (torch.arange(6) + prv).to(dtype).tolist()
        ctx.expect_equal(f"{dtype} ring value from rank {prv}", want, got.tolist())
    matrix = (torch.arange(24, dtype=torch.float32) + 100 * r).reshape(4, 6).to(ctx.device)
    view = torch.zeros(4, 6, device=ctx.device)
    try:
        works = [dist.isend(matrix[:, ::2], nxt), dist.irecv(view[:, 1::2], prv)]
        for w in works:
            w.wait()
    except (RuntimeError, ValueError) as exc:
        _expect_contiguity_refusal(ctx, "a non-contiguous view", exc)
        _unflattenable_views(ctx)
        return _beyond_views(ctx)
    expected = (torch.arange(24, dtype=torch.float32) + 100 * prv).reshape(4, 6)[:, ::2]
    ctx.expect_equal("non-contiguous view received into a non-contiguous view", expected.tolist(),
                     view[:, 1::2].cpu().tolist())
    ctx.expect_equal("untouched columns of the receive view", 0.0, view[:, ::2].abs().sum().item())
    _unflattenable_views(ctx)
    _beyond_views(ctx)


def _expect_contiguity_refusal(ctx: CheckContext, what: str, exc: Exception) -> None:
    """A refused non-contiguous P2P exchange names contiguity (or the target's own word for it); noted, then the
    ranks meet, since a side that refused may leave its peer's message unmatched."""
    words = refusal_words(ctx, "non-contiguous P2P", "contiguous")
    ctx.expect(any(w in str(exc) for w in words), f"refusal of {what}", f"an error naming one of {list(words)}",
               str(exc))
    ctx.note(f"{what}: refused clearly: {exc}")
    dist.barrier()


def _unflattenable_views(ctx: CheckContext) -> None:
    """A transposed view sent into a column slice of a wider buffer: neither is one run of evenly spaced elements
    (the views above are: every other element, which ``reshape(-1)`` still views), so a backend that writes through
    a flattened copy loses the message. Exact data in logical order and the columns beside the slice untouched, or
    a refusal naming contiguity on a group of its own (a message one side refused is left on that group only)."""
    n, r = ctx.world_size, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    group = ctx.new_group(list(range(n)))
    sent = (torch.arange(24, dtype=torch.float32) + 100 * r).reshape(4, 6).to(ctx.device).t()
    wide = torch.zeros(6, 7, device=ctx.device)
    what = "a transposed [6, 4] view received into columns 2-5 of a [6, 7] buffer"
    try:
        works = [dist.isend(sent, nxt, group=group), dist.irecv(wide[:, 2:6], prv, group=group)]
        for w in works:
            w.wait()
    except (RuntimeError, ValueError) as exc:
        _expect_contiguity_refusal(ctx, what, exc)
        return
    want = (torch.arange(24, dtype=torch.float32) + 100 * prv).reshape(4, 6).t()
    ctx.expect_equal(f"{what}, from rank {prv}", want.tolist(), wide[:, 2:6].cpu().tolist())
    beside = torch.cat([wide[:, :2], wide[:, 6:]], dim=1)
    ctx.expect_equal(f"{what}: the buffer's columns beside the view", 0.0, beside.abs().sum().item())


def _beyond_views(ctx: CheckContext) -> None:
    """P2P-DATA's cases after the views: tags and sources, one long channel, sends pending across collectives,
    subgroups, two groups of the same ranks, the generated cases."""
    _tags_and_any_source(ctx)
    _long_channel(ctx)
    _refilled_buffer(ctx)
    _beside_large_collectives(ctx)
    _in_subgroups(ctx)
    _groups_kept_apart(ctx)
    _generated(ctx)


def _groups_kept_apart(ctx: CheckContext) -> None:
    """Two groups of the same ranks keep their P2P apart: each rank isends the next one a message on the first
    group and another on the second, same tag, and the receiver takes the second group's first: each receive gets
    its own group's message (a backend that keys a channel by peer and tag alone hands over the first group's)."""
    n, r = ctx.world_size, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    first, second = ctx.new_group(list(range(n))), ctx.new_group(list(range(n)))
    got = {name: torch.full((2,), -1.0, device=ctx.device) for name in ("first", "second")}
    sends = [dist.isend(torch.full((2,), float(10 * r + k), device=ctx.device), nxt, group=g)
             for k, g in enumerate((first, second))]
    receives = [dist.irecv(got["second"], prv, group=second), dist.irecv(got["first"], prv, group=first)]
    for work in sends + receives:
        work.wait()
    ctx.expect_equal(f"messages of rank {prv} on two groups of the same ranks, the second group's received first: "
                     "(first group's, second group's)", ([10.0 * prv] * 2, [10.0 * prv + 1] * 2),
                     (got["first"].tolist(), got["second"].tolist()))


def _in_subgroups(ctx: CheckContext) -> None:
    """P2P on each group of the sweep but the world (halves, odd and even ranks, the ranks above 0, ...), peers
    named by global rank as torch takes them (torch hands the backend group ranks): a ring among the members with
    isend/irecv (tagged where the target matches tags), the same ring in one batch_isend_irecv, and, where the
    target receives from any source, recv(src=None) on the first member from every other, which must report each
    sender's global rank (torch maps the backend's group rank back). A backend that takes a group rank for a
    global one, or the reverse, sends to or reports the wrong rank."""
    found = Findings(ctx)
    tag = 3 if "p2p_tags" in ctx.target.capabilities else 0
    for label, group, members in sweep_groups(ctx):
        if label == "world" or len(members) < 2:
            continue
        order = sorted(members)
        i = order.index(ctx.rank)
        nxt, prv = order[(i + 1) % len(order)], order[(i - 1) % len(order)]
        for k, how in enumerate(("isend/irecv", "batch_isend_irecv")):
            sent = torch.arange(3, dtype=torch.int64, device=ctx.device) + 100 * ctx.rank + 10 * k
            got = torch.full((3,), -1, dtype=torch.int64, device=ctx.device)
            if k == 0:
                works = [dist.isend(sent, nxt, group=group, tag=tag), dist.irecv(got, prv, group=group, tag=tag)]
            else:
                works = dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, nxt, group=group),
                                                dist.P2POp(dist.irecv, got, prv, group=group)])
            for work in works:
                work.wait()
            found.case(expect_exact, ctx, got, [100 * prv + 10 * k + j for j in range(3)],
                       f"{label}: {how} ring, the message of global rank {prv}")
        if "p2p_any_source" in ctx.target.capabilities:
            found.case(_any_source_in, ctx, group, label, order)
    found.conclude()


def _any_source_in(ctx: CheckContext, group: dist.ProcessGroup | None, label: str, members: list[int]) -> None:
    """The first member (global ranks, sorted) takes one message from every other member with recv(src=None) on
    ``group`` (None: the world): each reported source is the sender's global rank, and the payload is that
    sender's. Then it posts one irecv(src=None) per other member at once, waits them all, and only then asks each
    Work its sender (``Work._source_rank()``, a group rank, which torch's recv reads right away): each Work names
    the sender of its own payload, fixed when it completed (gloo's RecvWork keeps the srcRank it matched), not
    whichever rank a later receive matched."""
    first, others = members[0], members[1:]
    if ctx.rank != first:
        dist.send(torch.full((2,), float(ctx.rank), device=ctx.device), first, group=group)
        dist.barrier(group=group)  # the first member has taken the message: the next one is the second round's
        dist.send(torch.full((2,), float(ctx.rank + 1000), device=ctx.device), first, group=group)
        return
    taken = []  # every message first, then the verdict: a sender must not be left waiting on a failed receiver
    for _ in others:
        buf = torch.full((2,), -1.0, device=ctx.device)
        taken.append((dist.recv(buf, src=None, group=group), buf.tolist()))
    dist.barrier(group=group)
    bufs = [torch.full((2,), -1.0, device=ctx.device) for _ in others]
    works = [dist.irecv(buf, src=None, group=group) for buf in bufs]
    for work in works:
        work.wait()
    named = [(_global_rank(group, w._source_rank()), buf.tolist()) for w, buf in zip(works, bufs, strict=True)]
    for src, payload in taken:
        ctx.expect_equal(f"{label}: recv(src=None) on global rank {first}: the payload of the rank it reported "
                         f"({src})", [float(src)] * 2, payload)
    ctx.expect_equal(f"{label}: the global ranks recv(src=None) reported on global rank {first}", others,
                     sorted(src for src, _ in taken))
    for k, (src, payload) in enumerate(named):
        ctx.expect_equal(f"{label}: irecv(src=None) #{k + 1} of {len(others)} posted at once on global rank {first}, "
                         f"asked its sender after all completed: the payload of the rank it named ({src})",
                         [float(src + 1000)] * 2, payload)
    ctx.expect_equal(f"{label}: the senders the posted irecv(src=None) Works named on global rank {first}", others,
                     sorted(src for src, _ in named))


def _global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    """``group_rank`` of ``group`` as a global rank (None: the world, where they are the same)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


# Messages on one (source, destination, tag) channel: past CPython's small-int cache (-5..256), so a backend
# that compares message numbers or counts with `is` shows it, and past any small ring of envelopes.
LONG_CHANNEL = 300


def _long_channel(ctx: CheckContext) -> None:
    """Every rank sends the next one LONG_CHANNEL one-element messages on one tag, each isend posted with the
    matching irecv from the rank behind (so a stack that moves a message only once its receive is posted
    progresses), all waited at the end: receive k holds message k (torch's per-channel FIFO)."""
    n, r = ctx.world_size, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    sent = [torch.full((1,), float(r * 1000 + k), device=ctx.device) for k in range(LONG_CHANNEL)]
    got = [torch.full((1,), -1.0, device=ctx.device) for _ in range(LONG_CHANNEL)]
    works = []
    for k in range(LONG_CHANNEL):
        works += [dist.isend(sent[k], nxt), dist.irecv(got[k], prv)]
    for w in works:
        w.wait()
    values = torch.cat(got).cpu().tolist()
    wrong = [(k, v) for k, v in enumerate(values) if v != float(prv * 1000 + k)]
    ctx.expect(not wrong, f"{LONG_CHANNEL} messages from rank {prv} on one tag, received in order",
               f"receive k holds message k ({prv * 1000} + k)", f"{len(wrong)} wrong, first (k, value): {wrong[:3]}")


REFILLS = ("an in-place copy_", "its .data", "a NumPy view of its memory", "its .data again")


def _refilled_buffer(ctx: CheckContext) -> None:
    """Every rank sends the next one the same tensor object once per refill in ``REFILLS``, refilled in between
    (writes through ``.data`` or NumPy do not move autograd's version counter, so a backend that skips packing a
    buffer it saw unchanged by that counter sends stale bytes): receive k holds fill k. On a device without NumPy
    views, ``.data`` stands in for them."""
    n, r = ctx.world_size, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    buf = torch.zeros(4, dtype=torch.int64, device=ctx.device)
    for k, how in enumerate(REFILLS):
        values = torch.arange(4, dtype=torch.int64) + 1000 * r + 10 * k
        if k == 0:
            buf.copy_(values.to(ctx.device))
        elif "NumPy" in how and buf.device.type == "cpu":
            buf.numpy()[:] = values.numpy()
        else:
            buf.data.copy_(values.to(ctx.device))
        got = torch.full((4,), -1, dtype=torch.int64, device=ctx.device)
        for w in (dist.isend(buf, nxt), dist.irecv(got, prv)):
            w.wait()
        want = (torch.arange(4) + 1000 * prv + 10 * k).tolist()
        ctx.expect_equal(f"message {k} from rank {prv}: the same tensor object it sent before, refilled through "
                         f"{how}", want, got.cpu().tolist())


LARGE_ELEMENTS = 1 << 20  # float32: 4 MiB, the size from which a backend may reduce in one chunk per rank


def _beside_large_collectives(ctx: CheckContext) -> None:
    """Every other rank isends rank 0 a message, then every rank runs two all_reduces of 4 MiB (an odd and an
    even op of the group, large enough for a backend to reduce them chunk by chunk across the ranks), and only
    then does rank 0 post its receives, all on the world: each all_reduce gives the exact sum, each receive the
    message sent before them (a backend whose collective bookkeeping overwrites what a sender posted for rank 0
    loses it)."""
    if not ctx.target.traits.sends_pass_collectives:
        ctx.note("sends outstanding across the group's collectives not tried: on this stack a send holds the "
                 "device queue of the group's collectives until its receive is posted (Traits.sends_pass_collectives)")
        return
    n, r = ctx.world_size, ctx.rank
    sent = torch.tensor([r * 100.0 + 7, -r * 100.0 - 7], device=ctx.device)
    work = dist.isend(sent, 0) if r != 0 else None
    for i in range(2):
        big = torch.full((LARGE_ELEMENTS,), float(r + 1 + i), device=ctx.device)
        dist.all_reduce(big)
        want = float(n * (n + 1) // 2 + n * i)
        ctx.expect_equal(f"all_reduce {i + 1} of 2 of 4 MiB with isends to rank 0 pending: (min, max)", (want, want),
                         (big.min().item(), big.max().item()))
    if work is not None:
        work.wait()
        return
    got = [torch.full((2,), 0.5, device=ctx.device) for _ in range(1, n)]
    for w in [dist.irecv(g, src) for src, g in enumerate(got, start=1)]:
        w.wait()
    ctx.expect_equal("the message each other rank isent rank 0 before two 4 MiB all_reduces, received after them",
                     [[src * 100.0 + 7, -src * 100.0 - 7] for src in range(1, n)], [g.tolist() for g in got])


def _generated(ctx: CheckContext) -> None:
    """The generated P2P cases (sizes from empty to MiBs, every dtype and value kind, layouts, tags, sources), on
    the world and on the group of the ranks above 0 (group rank j is global rank j + 1)."""
    _many_ahead(ctx)
    _many_tags(ctx)
    _posted_tags(ctx)
    found = Findings(ctx)
    found.case(_long_run, ctx)
    world = list(range(ctx.world_size))
    run_plan(ctx, found, p2p_cases.plan(ctx), lambda c: p2p_cases.p2p_case(ctx, c), world, "world")
    found.checkpoint()
    upper = world[1:]
    group = ctx.new_group(upper)
    if ctx.rank in upper and len(upper) > 1:
        run_plan(ctx, found, p2p_cases.plan(ctx), lambda c: p2p_cases.p2p_case(ctx, c, group, upper), upper,
                 f"ranks {upper}")
    found.conclude()


def _tags_and_any_source(ctx: CheckContext) -> None:
    """Tags select among messages; recv(src=None) reports the true source (where the target has them)."""
    n, r = ctx.world_size, ctx.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    if "p2p_tags" in ctx.target.capabilities:
        # sent with tags 11, 22, 5 and received 22, 5, 11: each receive passes over earlier messages whose tag
        # is another, lower (22 over 11) or higher (5 over 11 and 22)
        a, b, c = (torch.full((3,), k + r, dtype=torch.float32, device=ctx.device) for k in (1.0, 2.0, 3.0))
        ga, gb, gc = (torch.zeros(3, device=ctx.device) for _ in range(3))
        sends = [dist.isend(a, nxt, tag=11), dist.isend(b, nxt, tag=22), dist.isend(c, nxt, tag=5)]
        dist.recv(gb, prv, tag=22)
        dist.recv(gc, prv, tag=5)
        dist.recv(ga, prv, tag=11)
        for w in sends:
            w.wait()
        ctx.expect_equal("tag 22 received first", [2.0 + prv] * 3, gb.tolist())
        ctx.expect_equal("tag 5 (sent last) received second", [3.0 + prv] * 3, gc.tolist())
        ctx.expect_equal("tag 11 (sent first) received last", [1.0 + prv] * 3, ga.tolist())
    else:
        ctx.note("tag matching not checked: the target lacks capability p2p_tags (NCCL ignores tags); "
                 "a backend whose tags select among messages declares p2p_tags")
    if "p2p_any_source" in ctx.target.capabilities:
        _any_source_in(ctx, None, "world", list(range(n)))
        # rank 0's any-source receives take whichever tag-0 message comes first (torch's semantics): the last rank
        # sends it the mix below only once every one of them has matched (tests/vendor/test_timing.py)
        dist.barrier()
        _any_source_then_named(ctx)
    else:
        ctx.note("recv(src=None) not checked: the target lacks capability p2p_any_source; "
                 "a backend with an any-source receive declares p2p_any_source")


AHEAD = 40  # sends posted on one channel before their receives: more than a small ring of slots holds (32 here)


def _many_ahead(ctx: CheckContext) -> None:
    """On a fresh group (channels no message has used), even rank 2k sends to rank 2k+1 only, in two bursts of
    ``AHEAD`` isends each posted while the receiver is not receiving yet (the first before it has taken
    anything, the second after it took the first burst); it
    then receives the burst: each message exact, in send order (one direction per pair, so that no backend
    waits in a cycle)."""
    peer = ctx.rank ^ 1
    group = ctx.new_group(list(range(ctx.world_size)))
    if peer >= ctx.world_size:
        dist.barrier()
        return
    for burst in range(2):
        if ctx.rank % 2 == 0:
            works = [dist.isend(torch.arange(3, dtype=torch.int64, device=ctx.device) + 1000 * k + ctx.rank + burst,
                                peer, group=group) for k in range(AHEAD)]
            for work in works:
                work.wait()
        else:
            time.sleep(0.2)  # the sender posts its sends meanwhile
            for k in range(AHEAD):
                got = torch.zeros(3, dtype=torch.int64, device=ctx.device)
                dist.recv(got, peer, group=group)
                ctx.expect_equal(f"message #{k + 1} of burst {burst + 1} ({AHEAD} messages) from rank {peer}, "
                                 "sent before any of its receives", [1000 * k + peer + burst + i for i in range(3)],
                                 got.tolist())
    dist.barrier()


# tags a backend's message keys could confuse: 1 and 11 with two-digit message numbers (joined without a
# separator), 1 and 257, 0 and 256 (packed into 8 bits), 2**16 + 1 and 1 (16 bits), the largest, and 12 numbers each
MANY_TAGS = (0, 1, 11, 256, 257, 65537, 2**31 - 1)
PER_TAG = 12


def _many_tags(ctx: CheckContext) -> None:
    """On a fresh group, even rank 2k isends rank 2k+1 PER_TAG messages on each of MANY_TAGS, interleaved (a
    round over the tags in a drawn order, PER_TAG rounds), before its peer receives any; the peer receives them
    tag by tag, the tags in reverse: each message exact, in send order within its tag (where tags are declared)."""
    if "p2p_tags" not in ctx.target.capabilities:
        return
    peer = ctx.rank ^ 1
    group = ctx.new_group(list(range(ctx.world_size)))
    if peer < ctx.world_size and ctx.rank % 2 == 0:
        rng = random.Random(stable_seed(ctx.generation.seed, "p2p many tags"))
        works = []
        for k in range(PER_TAG):
            for tag in rng.sample(MANY_TAGS, len(MANY_TAGS)):
                payload = torch.tensor([MANY_TAGS.index(tag), k, ctx.rank], dtype=torch.int64, device=ctx.device)
                works.append(dist.isend(payload, peer, group=group, tag=tag))
        for work in works:
            work.wait()
    elif peer < ctx.world_size:
        time.sleep(0.2)  # the sender posts its sends meanwhile
        for tag in reversed(MANY_TAGS):
            for k in range(PER_TAG):
                got = torch.zeros(3, dtype=torch.int64, device=ctx.device)
                dist.recv(got, peer, group=group, tag=tag)
                ctx.expect_equal(f"message #{k + 1} with tag {tag} from rank {peer} ({PER_TAG} on each of tags "
                                 f"{list(MANY_TAGS)}, interleaved)", [MANY_TAGS.index(tag), k, peer], got.tolist())
    dist.barrier()


# The long run's messages (common.LONG_RUN): a sender whose sends complete at once runs ahead of its receiver (into
# slots not read yet, where a ring overwrites); at each window's end (message 2**k + 1) it waits instead until the
# receiver holds message 2**k, and then LONG_RUN_LATE_S more, so that the receiver asks for the reused key or slot
# first, before the new message is there
WINDOW_ENDS = frozenset(2**k + 1 for k in range(5, 11))  # 1-based message numbers


def _long_run(ctx: CheckContext) -> None:
    """On a fresh group, rank 0 sends rank 1 ``LONG_RUN`` messages of one int64 (message j: j * 1000), one send and
    one recv at a time (a window's reuse does not depend on the world size; one pair keeps the cost alike at every
    size), the sender held back at every ``WINDOW_ENDS`` until the receiver has the message before (through the
    store): every message exact."""
    group = ctx.new_group(list(range(ctx.world_size)))
    wrong: list[str] = []
    if ctx.world_size >= 2 and ctx.rank <= 1:
        t = torch.zeros(1, dtype=torch.int64, device=ctx.device)
        for j in range(1, LONG_RUN + 1):
            if ctx.rank == 0:
                if j in WINDOW_ENDS:
                    ctx.store.wait([f"p2p-long-run/{j - 1}"], timedelta(seconds=ctx.timeout_s))
                    time.sleep(LONG_RUN_LATE_S)
                t.fill_(j * 1000)
                dist.send(t, 1, group=group)
                continue
            dist.recv(t, 0, group=group)
            if len(wrong) < 3 and int(t.item()) != j * 1000:
                wrong.append(f"message #{j}: expected {j * 1000}, observed {int(t.item())}")
            if j + 1 in WINDOW_ENDS:
                post(ctx.store, f"p2p-long-run/{j}")
    dist.barrier()  # before the verdict: every rank meets here whatever rank 1 received
    if wrong:
        raise CheckFailed(f"rank 1: {LONG_RUN} messages in a row from rank 0 (message j: j * 1000; the sender held "
                          f"until this rank had message 2**k, then {LONG_RUN_LATE_S} s): " + "; ".join(wrong))


# irecvs a receiver posts at once, each with a tag of its own: more than a pool of 4, 8 or 16 pollers holds
POSTED = 17
POSTED_TAGS = tuple(7 * k + 2 for k in range(POSTED))
FIRST_WAIT_S = 10.0  # how long the last-posted receive may take once its message is sent


def _posted_tags(ctx: CheckContext) -> None:
    """On a fresh group, odd rank 2k+1 posts ``POSTED`` irecvs from rank 2k, one per tag of POSTED_TAGS, before any
    message exists; rank 2k then sends the last-posted tag's message alone: that receive completes (wait with a
    timeout of FIRST_WAIT_S) while every earlier one is still pending. Told so through the store, rank 2k sends
    the rest, the tags in reverse; each receive gets its own tag's message exact (where the target declares
    p2p_tags and p2p_unordered_receives: P2P ops on NCCL's stream, and the simulator's, complete in posting order)."""
    if not {"p2p_tags", "p2p_unordered_receives"} <= ctx.target.capabilities:
        return
    peer = ctx.rank ^ 1
    group = ctx.new_group(list(range(ctx.world_size)))
    pair = min(ctx.rank, peer)
    key = f"p2p-posted-tags/{pair}"
    what = f"{POSTED} irecvs from rank {peer} posted at once, tags {POSTED_TAGS[0]}..{POSTED_TAGS[-1]}"

    def payload(i: int, sender: int) -> torch.Tensor:
        return torch.tensor([POSTED_TAGS[i], i, sender], dtype=torch.int64, device=ctx.device)

    if peer < ctx.world_size and ctx.rank % 2 == 0:
        time.sleep(0.2)  # the receiver posts its irecvs meanwhile
        works = [dist.isend(payload(POSTED - 1, ctx.rank), peer, group=group, tag=POSTED_TAGS[-1])]
        ctx.store.wait([key], timedelta(seconds=ctx.timeout_s))
        if ctx.store.get(key) != b"go":
            raise CheckFailed(f"rank {ctx.rank}: rank {peer} posted {POSTED} irecvs from this rank and reported "
                              f"that the last one did not complete once its message was sent (its error is on rank "
                              f"{peer}); the other {POSTED - 1} messages were not sent")
        works += [dist.isend(payload(i, ctx.rank), peer, group=group, tag=POSTED_TAGS[i])
                  for i in reversed(range(POSTED - 1))]
        for work in works:
            finish_work(ctx, f"isend to rank {peer} ({what})", work)
    elif peer < ctx.world_size:
        got = [torch.zeros(3, dtype=torch.int64, device=ctx.device) for _ in range(POSTED)]
        works = [dist.irecv(got[i], peer, group=group, tag=tag) for i, tag in enumerate(POSTED_TAGS)]
        last = f"{what}: the last one (tag {POSTED_TAGS[-1]}), its message sent alone"
        want = payload(POSTED - 1, peer).tolist()
        try:
            done = works[-1].wait(timedelta(seconds=FIRST_WAIT_S))
        except RuntimeError as exc:
            post(ctx.store, key, b"stop")
            raise CheckFailed(f"rank {ctx.rank}: {last}: wait({FIRST_WAIT_S} s) raised {exc!r}; expected it to "
                              f"complete while the {POSTED - 1} earlier receives wait for theirs") from None
        # the sender learns the outcome before any finding is raised here, so it never waits out its store timeout
        post(ctx.store, key, b"go" if done and got[-1].tolist() == want else b"stop")
        ctx.expect_equal(f"{last}: wait({FIRST_WAIT_S} s) returned", True, done)
        ctx.expect_equal(f"{last}: the message", want, got[-1].tolist())
        for i in reversed(range(POSTED - 1)):
            finish_work(ctx, f"irecv tag {POSTED_TAGS[i]} ({what})", works[i])
            ctx.expect_equal(f"{what}: the message of tag {POSTED_TAGS[i]}", payload(i, peer).tolist(),
                             got[i].tolist())
    dist.barrier()


# Past 4 MiB (NCCL's default channel buffer, NCCL_BUFFSIZE) a stack may move a message only once its receive
# is posted: the second and fourth messages of the mix below are that large, one taken by a named receive,
# one by an any-source receive.
BIG_MESSAGE = (4 << 20) // 4 + 1  # int32 elements
MIXED_SIZES = (3, BIG_MESSAGE, 5, BIG_MESSAGE)
NAMED_IN_MIX = (1,)  # which receives of the mix name their source


def _any_source_then_named(ctx: CheckContext) -> None:
    """The last rank sends rank 0 four messages; rank 0 takes them with recv(src=None), a named recv, then
    recv(src=None) twice: each receive gets the next message in send order, whichever way it names its
    source, and an any-source recv reports the last rank. The first receive waits for its message."""
    n, last = ctx.world_size, ctx.world_size - 1
    if ctx.rank == last:
        time.sleep(0.2)  # the first receive is issued (and waits) before any message exists
        for k, count in enumerate(MIXED_SIZES):
            dist.send(torch.arange(count, dtype=torch.int32, device=ctx.device) * 3 + 1000 * k, 0)
    elif ctx.rank == 0:
        for k, count in enumerate(MIXED_SIZES):
            got = torch.zeros(count, dtype=torch.int32, device=ctx.device)
            named = last if k in NAMED_IN_MIX else None
            src = dist.recv(got, src=named)
            what = f"rank 0: message #{k + 1} of rank {last} ({count} int32) by recv(src={named}) (world {n})"
            ctx.expect_equal(f"{what}: the source recv reported", last, src)
            want = torch.arange(count, dtype=torch.int32) * 3 + 1000 * k
            wrong = (got.cpu() != want).nonzero()
            if len(wrong):
                i = int(wrong[0])
                raise CheckFailed(f"{what}: element {i} is {int(got[i])}, expected {int(want[i])} "
                                  f"({len(wrong)} of {count} elements differ)")
    dist.barrier()


@check("P2P-MISMATCH")
def mismatch(ctx: CheckContext) -> None:
    """Size or dtype mismatch between send and recv: an error, never silent data.

    On a target whose ``wait()`` only orders device streams (``Traits.p2p_wait_timeout_s`` set, e.g.
    NCCL) the recv is waited on with that timeout, so a receive the device never completes raises
    instead of looking done; such a target runs this check in rank processes of its own, and after
    the first refusal the communicator may be unusable, so the remaining cases are not tried.
    """
    ctx.init_world(default_mode(ctx))
    wait_s = ctx.target.traits.p2p_wait_timeout_s

    def wait(work: dist.Work) -> None:
        if wait_s is None:
            work.wait()
        else:
            work.wait(timedelta(seconds=wait_s))

    # The refusal (or the timeout the requirement admits) must name both sides of the mismatch and the peer;
    # an unrelated error that merely quotes the sizes (a failed copy_) names no peer.
    peer = ("rank 0", "src=0", "src 0", "from 0", "peer 0", "source 0")
    needles = {
        "size": (("4",), ("8",), peer),
        "dtype": (("float32", "Float"), ("float64", "Double"), peer),
        "one-element message into a larger buffer": (("1",), ("4",), peer),  # copy_ would broadcast it
        "message larger than the buffer": (("8",), ("4",), peer),  # gloo aborts the receiving process here
    }
    # the requirement admits a timeout naming the pair; where the check itself bounds the wait (a device backend
    # whose wait() only orders streams), the timeout is the check's and the backend's message can only name the op
    # (NCCL: "WorkNCCL(... OpType=RECV ...)")
    timeouts: tuple[Needle, ...] = ("rank 0", "rank 1") if wait_s is None else (("OpType=RECV", "recv"),)
    found = Findings(ctx)  # rank 1 receives every case even after a silent one, so rank 0's sends never wait it out
    for what, send_t, recv_t in (
        ("size", torch.ones(4), torch.zeros(8)),
        ("dtype", torch.ones(4), torch.zeros(4, dtype=torch.float64)),
        ("one-element message into a larger buffer", torch.ones(1), torch.zeros(4)),
        ("message larger than the buffer", torch.ones(8), torch.zeros(4)),
        *((_same_size(sent.dtype, into), sent, torch.zeros(4, dtype=into)) for sent, into in SAME_SIZE_PAIRS),
    ):
        if ctx.rank == 0:
            try:
                wait(dist.isend(send_t.to(ctx.device), 1))
            except Exception as exc:  # noqa: BLE001 - the sender may also report the mismatch
                ctx.note(f"{what} mismatch reported on the sender: {type(exc).__name__}: {exc}")
        elif ctx.rank == 1 and what not in needles:  # a dtype of the same element size
            found.case(_bytes_or_refusal, ctx, what, lambda t: wait(dist.irecv(t, 0)), send_t, recv_t.to(ctx.device),
                       (cc.ALIASES[send_t.dtype], cc.ALIASES[recv_t.dtype], peer), timeouts)
        elif ctx.rank == 1:
            found.case(expect_raises, ctx, f"recv with a {what} mismatch against rank 0's send",
                       lambda t=recv_t: wait(dist.irecv(t.to(ctx.device), 0)), contains=needles[what],
                       timeout_contains=timeouts)
        if wait_s is not None:
            ctx.note(f"only the {what} case was run: after a mismatched P2P the communicator of target "
                     f"{ctx.target.name} may be unusable")
            break
    found.conclude()


# (message, buffer dtype) of the same element size: no value survives a conversion unchanged, so received bytes
# and converted values differ in every element
SAME_SIZE_PAIRS = (
    (torch.tensor([1.5, -2.25, 3.75, 1e10]), torch.int32),
    (torch.tensor([1.5, -2.25, 3.75, 1000.0], dtype=torch.float16), torch.bfloat16),
    (torch.tensor([3, -7, 2**40 + 1, 2**62], dtype=torch.int64), torch.float64),
)
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # an integer view of each element size, to compare bits


def _same_size(sent: torch.dtype, into: torch.dtype) -> str:
    return f"dtype of the same element size ({ref.dtype_name(sent)}[4] into {ref.dtype_name(into)}[4])"


def _bytes_or_refusal(ctx: CheckContext, what: str, receive: Callable[[torch.Tensor], None], sent: torch.Tensor,
                      buffer: torch.Tensor, needles: tuple[Needle, ...], timeouts: tuple[Needle, ...]) -> None:
    """A message received into a buffer of another dtype of the same element size: refused naming both dtypes
    and the peer (or timed out naming the pair), or the sender's bytes as they are (NCCL and gloo move bytes: the
    buffer holds the sent bit patterns); never converted values."""
    what = f"recv with a {what} mismatch against rank 0's send"
    try:
        receive(buffer)
    except Exception as exc:  # noqa: BLE001 - judged as a refusal
        expect_refusal(ctx, what, exc, needles, timeouts)
        return
    bits = _BITS[sent.element_size()]
    expect_exact(ctx, buffer.view(bits), sent.view(bits).tolist(),
                 f"{what}: accepted, so the buffer must hold the sender's bytes (not converted values)")


@check("P2P-BAD-INPUT")
def bad_input(ctx: CheckContext) -> None:
    """Invalid P2P requests are refused with a clear error."""
    ctx.init_world(default_mode(ctx))
    n, r = ctx.world_size, ctx.rank
    t = torch.ones(2, device=ctx.device)
    expect_raises(ctx, "send to self", lambda: dist.send(t, r), contains=(("same as the rank", f"rank {r}"),))
    expect_raises(ctx, "batch_isend_irecv of an empty list", lambda: dist.batch_isend_irecv([]),
                  contains=(("empty", "p2p_op_list", "list index"),))
    sub = ctx.new_group(list(range(n)))
    expect_raises(ctx, "batch with ops on two groups", lambda: dist.batch_isend_irecv([
        dist.P2POp(dist.isend, t, (r + 1) % n), dist.P2POp(dist.irecv, t, (r - 1) % n, group=sub)]),
        contains=("same group",))
    expect_raises(ctx, "P2POp built with all_reduce", lambda: dist.P2POp(dist.all_reduce, t, (r + 1) % n),
                  contains=(("isend", "irecv", "op"),))
    dist.barrier()


def _refused_before_first(ctx: CheckContext, words: tuple[str, ...] | None) -> None:
    """A new lazy group whose first P2P calls are refused: rank 0 sends to, and rank 1 receives from, peers outside
    the group (by group rank, which torch passes on unchecked). A refused call makes no communicator and spends no
    warning, so the pair's first real message (rank 0 to rank 1) still warns once on each of its two ranks, and the
    only communicators made are 2-rank ones of group members. A refusal that takes the group's whole timeout (a
    backend that waits for the peer, P2P-PEER-OUTSIDE's subject) may leave the communicator broken: then this part
    is not judged."""
    n = ctx.world_size
    group = ctx.new_group(list(range(n)), timeout_s=REFUSAL_WAIT_S)
    since = ctx.probe.mark()
    problems: list[str] = []
    waited = False
    with warned.recorded() as caught:
        if ctx.rank in (0, 1):
            op = "send" if ctx.rank == 0 else "recv"
            for peer in (n, -1):
                started = time.monotonic()
                try:
                    _p2p_call(op, torch.ones(2, device=ctx.device), peer, group, by_group_rank=True)
                except Exception:  # noqa: BLE001 - the refusal (P2P-PEER-OUTSIDE judges its words)
                    waited |= time.monotonic() - started >= 0.9 * REFUSAL_WAIT_S
                else:
                    problems.append(f"rank {ctx.rank}: {op} naming group peer {peer} (outside a group of {n}) "
                                    "returned instead of being refused")
        state = "waited" if waited else "accepted" if problems else "refused"
        said = agree(ctx, list(range(n)), "refused-before-first", state)
        judged = all(x == "refused" for x in said)  # else P2P-PEER-OUTSIDE's finding; the message is not sent
        if judged:
            try:
                if ctx.rank == 0:
                    dist.send(torch.full((2,), 7.0, device=ctx.device), group_dst=1, group=group)
                elif ctx.rank == 1:
                    got = torch.zeros(2, device=ctx.device)
                    dist.recv(got, group_src=0, group=group)
                    if got.tolist() != [7.0, 7.0]:
                        problems.append(f"rank 1: the message after the refused calls: expected [7.0, 7.0], "
                                        f"observed {got.tolist()}")
            except Exception as exc:  # noqa: BLE001 - named below; the ranks still meet at the barrier
                problems.append(f"rank {ctx.rank}: the group's first real message (rank 0 to rank 1) after refused "
                                f"calls raised {type(exc).__name__}: {exc}")
    dist.barrier()
    if not judged:
        if problems:
            raise CheckFailed("; ".join(problems))
        ctx.note("refused P2P then a first real message not judged: a call naming a peer outside the group waited "
                 "out the group's timeout or returned (P2P-PEER-OUTSIDE judges that)")
        return
    seen, _ = warned.matching(caught, lambda m: is_lazy_p2p_warning(m, words))
    what = (f"rank {ctx.rank}: a new lazy group whose first P2P calls name peers outside it (refused), then rank 0 "
            "sends rank 1 one message")
    if ctx.rank in (0, 1) and len(seen) != 1:
        problems.append(f"{what}: lazy-P2P warnings: expected 1 (the refused calls make no communicator), "
                        f"observed {len(seen)}")
    odd = [e.get("members") for e in new_comms(ctx, since)
           if len(set(e.get("members") or ())) != len(e.get("members") or ()) or
           not set(e.get("members") or ()) <= set(range(n))]
    if odd:
        problems.append(f"{what}: communicators made for members outside the group or with a rank twice: {odd}")
    if problems:
        raise CheckFailed("; ".join(problems))


REFUSAL_WAIT_S = 2.0  # the group's timeout here: a refusal is immediate, a backend that waits times out this soon
OUTSIDE_OPS = ("send", "isend", "recv", "irecv")


def outside_peers(size: int) -> tuple[int, ...]:
    """Peers outside a group of ``size``: the first rank past it, the next, one further out, and -1 (which a
    backend that indexes a Python list of its peers takes for the last rank)."""
    return size, size + 1, size + 3, -1


def _p2p_call(op: str, tensor: torch.Tensor, peer: int, group: Any = None, by_group_rank: bool = False) -> None:
    """``op`` with ``peer`` named as a global rank, or as a group rank (group_dst / group_src), run to completion."""
    sending = op in ("send", "isend")
    name = ("group_" if by_group_rank else "") + ("dst" if sending else "src")
    fn = {"send": dist.send, "isend": dist.isend, "recv": dist.recv, "irecv": dist.irecv}[op]
    result = fn(tensor, group=group, **{name: peer})
    if op in ("isend", "irecv") and result is not None:
        result.wait()


@check("P2P-PEER-OUTSIDE")
def peer_outside(ctx: CheckContext) -> None:
    """send, isend, recv and irecv naming a peer outside the group (which torch passes to the backend unchecked on
    the default group, and on any group when named by group rank) are each refused naming the peer, or time out
    naming it; never a crash, a silent success or a nameless error. The peers are the group's size (one past its
    last rank), the next, one further out and -1, on the world by global rank and, from 3 ranks, on the group of the
    ranks above 0 by group rank (group_dst / group_src). A refusal is immediate, so the group's timeout is capped
    at ``REFUSAL_WAIT_S``: a backend that waits for the peer instead times out after that long."""
    ctx.init_world(default_mode(ctx), timeout_s=REFUSAL_WAIT_S)
    n = ctx.world_size
    upper = list(range(1, n))
    sub = ctx.new_group(upper, timeout_s=REFUSAL_WAIT_S) if n >= 3 else None
    cases: list[tuple[str, Any, list[int], bool]] = [("the world", None, list(range(n)), False)]
    if sub is not None and ctx.rank in upper:
        cases.append((f"group {upper} (peer named by group rank)", sub, upper, True))
    failures: list[str] = []
    for where, group, members, by_group_rank in cases:
        for peer in outside_peers(len(members)):
            for op in OUTSIDE_OPS:
                what = f"{where}: {op} naming peer {peer} (group of {len(members)})"
                t = torch.ones(2, device=ctx.device)
                try:
                    call = functools.partial(_p2p_call, op, t, peer, group, by_group_rank)
                    expect_raises(ctx, what, call, contains=(str(peer),), timeout_contains=(str(peer),))
                except CheckFailed as exc:
                    failures.append(str(exc))
    # the ranks above 0 ran twice the cases: they meet through the store (the check's timeout) before the world's
    # barrier, whose timeout is REFUSAL_WAIT_S, so that a loaded host's lag is not read as the world broken
    agree(ctx, list(range(n)), "peer-outside-done", "done")
    dist.barrier()
    if failures:
        raise CheckFailed(f"{len(failures)} case(s) failed: " + "; ".join(failures[:6]))


@check("P2P-SERIALIZATION")
def serialization(ctx: CheckContext) -> None:
    """Unbatched P2P to several peers on one communicator: record which stream each ran on."""
    ctx.init_world("eager")
    since = ctx.probe.mark()
    _exchange(ctx, all_pairs(ctx.world_size), salt=3)
    launches = [e for e in ctx.probe.events("launch", since) if e["op"] in ("send", "recv")]
    ctx.expect(bool(launches), "P2P launches seen by the probe", "some", 0)
    require_fields(ctx, launches, "stream", "comm")
    comms = {e["comm"] for e in launches}
    streams = {e["stream"] for e in launches}
    ctx.expect_equal("communicators carrying unbatched P2P under eager init", 1, len(comms))
    ctx.note(f"P2P to {ctx.world_size - 1} peers ran on one communicator over {len(streams)} streams; "
             "NCCL serializes ops on one communicator even across streams")


@check("P2P-NAMED-SENDERS")
def named_senders(ctx: CheckContext) -> None:
    """One rank receives from several named senders, several messages each, asking in the opposite order
    to the one the messages arrive in: recv(src=s) gets s's messages, in the order s sent them."""
    ctx.init_world(default_mode(ctx))
    n, r, per_sender = ctx.world_size, ctx.rank, 3
    found = Findings(ctx)
    for dtype in (torch.float32, torch.int64):
        if r == 0:
            for src in range(1, n):  # the lowest sender sends last, yet is asked first
                for k in range(per_sender):
                    buf = torch.zeros(4, dtype=dtype, device=ctx.device)
                    dist.recv(buf, src)
                    want = ref.values(src, 4, dtype, salt=k)
                    bad = ref.mismatch(buf, want, dtype)
                    found.case(ctx.expect, bad is None, f"message {k} of {per_sender} received with recv(src={src}) "
                               f"({ref.dtype_name(dtype)})", f"rank {src}'s message {k}", bad)
        else:
            time.sleep(0.05 * (n - 1 - r))  # the highest rank sends first
            for k in range(per_sender):
                dist.send(ref.tensor(ref.values(r, 4, dtype, salt=k), dtype, ctx.device), 0)
        dist.barrier()
    found.conclude()
