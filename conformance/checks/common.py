"""Helpers shared by checks: group-shape sweeps, event queries, tensors."""

from __future__ import annotations

import contextlib
import inspect
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.option_bounds import OPTIONS
from conformance.checks.reference import mismatch
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed, NotObservable
from conformance.targets.base import ConfigPart, OptionsPart


def group_shapes(world_size: int) -> dict[str, list[list[int]]]:
    """UCC-style split shapes: world, reversed, first half, halves, odd/even, single rank, uneven."""
    ranks = list(range(world_size))
    half = max(1, world_size // 2)
    shapes = {
        "world": [ranks],
        "reversed": [ranks[::-1]],
        "first_half": [ranks[:half]],
        "halves": [ranks[:half], ranks[half:]],
        "odd_even": [ranks[0::2], ranks[1::2]],
        "single_rank": [[0]],
        "uneven": [ranks[:1], ranks[1:]],
    }
    return {name: [g for g in groups if g] for name, groups in shapes.items()}


def default_mode(ctx: CheckContext) -> str:
    """Eager when the target can bind a device, else lazy."""
    return "eager" if "device_binding" in ctx.target.capabilities else "lazy"


def _part(ctx: CheckContext, name: str, capability: str) -> Any:
    part = getattr(ctx.target.parts, name)
    if part is None:
        raise RuntimeError(f"{ctx.requirement.id}: the check uses the {name} part, but the requirement does not "
                           f"need capability {capability!r} (target {ctx.target.name} has none)")
    return part


def options_part(ctx: CheckContext) -> OptionsPart:
    """The target's options part; the requirement must need capability ``options`` (which is that part)."""
    return _part(ctx, "options", "options")


def config_part(ctx: CheckContext) -> ConfigPart:
    """The target's config part; the requirement must need capability ``observe:config`` (which is that part)."""
    return _part(ctx, "config", "observe:config")


_EDITED = "<edited by the suite>"


def effective_config(ctx: CheckContext, group: Any, what: str) -> dict[str, Any] | None:
    """The effective config of ``group`` as the target reports it, shown to be a snapshot: the dict the target
    returned is edited (each entry replaced, one added) and read again, which must give what the first read gave.
    A report that is the group's live state would change under a check that compares an earlier reading with a
    later one, and would let whoever edits it change the group's config. Nested values are not edited."""
    part = config_part(ctx)
    config = part.effective(group, ctx.probe)
    if not isinstance(config, dict):
        return config
    kept = dict(config)
    try:
        for key in list(config):
            config[key] = _EDITED
        config[_EDITED] = _EDITED
    except TypeError:  # a read-only mapping is a snapshot as far as editing goes
        return kept
    again = part.effective(group, ctx.probe)
    if again != kept:
        raise CheckFailed(f"rank {ctx.rank}: {what}: the effective config changed when the suite edited the dict "
                          f"the target had returned for it (its live state, not a copy): first read {kept}, read "
                          f"after the edit {again}")
    return kept


def ranked_values(rank: int, n: int = 8, salt: int = 0) -> list[float]:
    """The values of ``ranked_tensor`` on rank ``rank``: what a peer expects from it."""
    return [float(i + 100 * (rank + 1) + 1000 * salt) for i in range(n)]


def ranked_tensor(ctx: CheckContext, n: int = 8, dtype: torch.dtype = torch.float32, salt: int = 0) -> torch.Tensor:
    """A tensor whose values identify this rank (and ``salt``): ``ranked_values``."""
    return torch.tensor(ranked_values(ctx.rank, n, salt), dtype=torch.float64).to(dtype).to(ctx.device)


def expect_allreduce_members(ctx: CheckContext, group: dist.ProcessGroup, members: list[int], what: str) -> None:
    """An all_reduce of (global rank + 1) over ``group`` must sum exactly ``members``.

    The +1 keeps a skipped all_reduce from matching by chance (a lone rank 1 holds 2, not 1+2).
    """
    t = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(t, group=group)
    ctx.expect_equal(f"{what}: all_reduce of (global rank + 1) over the group", float(sum(m + 1 for m in members)),
                     t.item())


def new_comms(ctx: CheckContext, since: int) -> list[dict[str, Any]]:
    """Communicators created on this rank after ``since``."""
    return ctx.probe.events("comm_created", since)


def world_comm(ctx: CheckContext) -> dict[str, Any]:
    """The comm_created event of the world communicator (NotObservable if the probe records no modes).

    A probe that breaks the probe protocol (an ``events()`` default other than ``since=0``, a kind filter that
    lets other kinds through: ``CombinedProbe.protocol_breach``) fails here: its record cannot back the claim."""
    breach = getattr(ctx.probe, "protocol_breach", lambda: None)()
    if breach is not None:
        raise CheckFailed(f"rank {ctx.rank}: target {ctx.target.name}'s probe breaks the probe protocol: {breach}")
    events = ctx.probe.events("comm_created")
    if events and all(e.get("mode") is None or e.get("members") is None for e in events):
        raise NotObservable(f"target {ctx.target.name}'s probe records no creation mode or members for communicators")
    for event in events:
        if event["mode"] in ("eager", "lazy") and len(event["members"]) == ctx.world_size:
            return event
    raise CheckFailed(f"rank {ctx.rank}: no world communicator was recorded by the probe")


def require_fields(ctx: CheckContext, events: list[dict[str, Any]], *fields: str) -> None:
    """NotObservable when the probe leaves a field this check needs empty (real-stack probes can)."""
    for event in events:
        blank = [f for f in fields if event.get(f) is None]
        if blank:
            raise NotObservable(f"target {ctx.target.name}'s probe does not record {blank} for {event['kind']} events")


def refusal_words(ctx: CheckContext, kind: str, *generic: str) -> tuple[str, ...]:
    """Words any one of which a refusal of ``kind`` must contain: the check's ``generic`` ones plus the
    target's own wording (``Traits.refusal_words[kind]``, e.g. NCCL's name for a config field)."""
    return (*generic, *ctx.target.traits.refusal_words.get(kind, ()))


TIMEOUT_WORDS = ("timed out", "timeout", "timing out", "deadline")

Needle = str | tuple[str, ...]


def _names(text: str, needle: Needle) -> bool:
    """A string must appear as written; a tuple is alternatives, any one of them (case-insensitive)."""
    if isinstance(needle, str):
        return needle in text
    return any(n.lower() in text.lower() for n in needle)


def expect_raises(ctx: CheckContext, what: str, fn: Any, kinds: tuple[type[BaseException], ...] = (Exception,),
                  contains: tuple[Needle, ...] = (), timeout_contains: tuple[Needle, ...] = ()) -> BaseException:
    """``fn()`` must raise one of ``kinds`` whose message names every entry of ``contains``.

    A refusal check always says what the message must name: ``contains`` may not be empty. An error that
    reads as a timeout is not a refusal unless the requirement admits one: then ``timeout_contains`` says what
    the timeout must name instead (the pair, the key).
    """
    if not contains:
        raise TypeError(f"expect_raises({what!r}): a refusal check must name what the error must contain")
    try:
        fn()
    except kinds as exc:
        return expect_refusal(ctx, what, exc, contains, timeout_contains)
    except Exception as exc:  # noqa: BLE001 - wrong exception class is a finding
        raise CheckFailed(f"rank {ctx.rank}: {what}: expected {[k.__name__ for k in kinds]}, observed "
                          f"{type(exc).__name__}: {exc}") from None
    raise CheckFailed(f"rank {ctx.rank}: {what}: expected an error, observed success")


_TORCH_DIR = Path(torch.__file__).resolve().parent


def _raised_in_torch(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is torch's own code (its front end)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_TORCH_DIR)


def not_an_assert(ctx: CheckContext, what: str, exc: BaseException) -> None:
    """A backend's refusal is a raised error, not a failed ``assert``: python -O removes assert statements, and the
    call then runs on the bad input (torch's backends refuse with RuntimeError, ValueError or TypeError). torch's own
    front end raises AssertionError itself ('Unknown c10d backend type', v2.13.0 distributed_c10d.py:2238): not the
    backend's."""
    if isinstance(exc, AssertionError) and not _raised_in_torch(exc):
        raise CheckFailed(f"rank {ctx.rank}: {what}: refused by an assert statement (AssertionError: {exc}), "
                          "which python -O removes: expected a raised error (RuntimeError, ValueError or TypeError)"
                          ) from None


def expect_refusal(ctx: CheckContext, what: str, exc: BaseException, contains: tuple[Needle, ...],
                   timeout_contains: tuple[Needle, ...] = ()) -> BaseException:
    """An error already caught must name every entry of ``contains`` (a timeout: of ``timeout_contains``,
    and only where that is given), as ``expect_raises`` requires of the error it catches; never an assert's."""
    not_an_assert(ctx, what, exc)
    text = f"{type(exc).__name__}: {exc}"
    timed_out = isinstance(exc, TimeoutError) or any(w in text.lower() for w in TIMEOUT_WORDS)
    if timed_out and not timeout_contains:
        raise CheckFailed(f"rank {ctx.rank}: {what}: expected a refusal naming {list(contains)}, observed a "
                          f"timeout: {text}") from None
    missing = [c for c in (timeout_contains if timed_out else contains) if not _names(text, c)]
    if missing:
        raise CheckFailed(f"rank {ctx.rank}: {what}: error does not name {missing}: {text}") from None
    return exc


def expect_exact(ctx: CheckContext, got: torch.Tensor, want: list[Any], what: str) -> None:
    """``got`` holds exactly ``want`` (values each rank computed from the known inputs), compared in its dtype."""
    ctx.expect(mismatch(got, want, got.dtype) is None, what, want, got.tolist())


# torch's error when a Python ProcessGroup subclass does not implement an op: the base class looks for a
# per-device backend it never registered (seen on torch 2.13 with examples/toyccl, which has no gather)
NO_OP = "No backend type associated with device type"
# how a backend declines an op it lacks: c10d's Backend ('Backend gloo does not support gather_single'), or NO_OP
UNSUPPORTED = ("does not support", "not supported", "unsupported", NO_OP)
SCALAR_WORDS = ("size", "shape")  # what a refusal of a 0-d piece may name (gloo: 'invalid tensor size at index 0')

# ops or messages in a row on one fresh group: past 1024, so that a backend that reuses per-op keys, slots or
# sequence numbers in a window of 2**k (k <= 10) wraps at least once; a side late around a window's end sleeps this
LONG_RUN = 1030
LONG_RUN_LATE_S = 0.02

# how much later than its group's timeout a peer's error may come (6 s seen at load 80 on 2 cores)
PEER_SLACK_S = 15.0
TIMEOUT_NEEDLE: Needle = ("timed out", "timeout", "timing out")


def finish_work(ctx: CheckContext, what: str, work: dist.Work) -> None:
    """Wait for ``work``; on a target whose ``wait()`` only orders device streams (``Traits.p2p_wait_timeout_s``
    set, e.g. NCCL) with that timeout, so that an op the device never completes raises instead of looking done."""
    wait_s = ctx.target.traits.p2p_wait_timeout_s
    if wait_s is None:
        work.wait()
    elif not work.wait(timedelta(seconds=wait_s)):
        raise CheckFailed(f"rank {ctx.rank}: {what}: wait({wait_s} s) returned False")


def exit_holders() -> set[threading.Thread]:
    """The Python threads that would hold this process at exit: alive, not daemons, not the main thread (the
    interpreter joins every such thread before it exits: CPython's threading._shutdown)."""
    main = threading.main_thread()
    return {t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not main}


def positive_exit_holder(ctx: CheckContext) -> None:
    """``exit_holders`` sees a non-daemon thread of the check's own, started now (then released and joined)."""
    before = exit_holders()
    release = threading.Event()
    mine = threading.Thread(target=release.wait, name="conformance-positive-control")
    mine.start()
    try:
        seen = mine in exit_holders() - before
    finally:
        release.set()
        mine.join()
    ctx.expect_equal("positive control: the thread probe sees a non-daemon thread of the check's own", True, seen)


def work_success(ctx: CheckContext, what: str, work: dist.Work) -> bool | None:
    """``work.is_success()`` (c10d Work::isSuccess: completed without an exception, v2.13.0
    torch/csrc/distributed/c10d/Work.cpp; gloo's works inherit it), or None where the backend refuses it as
    deprecated, as ProcessGroupNCCL's WorkNCCL::isSuccess does (NotImplementedError('WorkNCCL::isSuccess() is
    deprecated')): that refusal is noted, not failed; any other NotImplementedError fails."""
    try:
        return bool(work.is_success())
    except NotImplementedError as exc:
        if "deprecated" not in str(exc):
            raise CheckFailed(f"rank {ctx.rank}: {what}: work.is_success(): expected a bool (or NCCL's 'is "
                              f"deprecated' refusal), observed NotImplementedError: {exc}") from None
        ctx.note(f"{what}: work.is_success() refused as deprecated ({exc})")
        return None


def expect_peer_raises(ctx: CheckContext, what: str, fn: Callable[[], Any], names: tuple[Needle, ...],
                       timeout_s: float, start: float | None = None, slack_s: float = PEER_SLACK_S,
                       kinds: tuple[type[BaseException], ...] = (Exception,)) -> None:
    """``fn`` must raise one of ``kinds``, naming ``names`` or as a timeout, within ``timeout_s`` plus
    ``slack_s`` of ``start`` (default: now): never return."""
    start = time.monotonic() if start is None else start
    expect_raises(ctx, what, fn, kinds, contains=names, timeout_contains=(TIMEOUT_NEEDLE,))
    took = time.monotonic() - start
    limit = timeout_s + (ctx.target.traits.p2p_wait_timeout_s or 0.0) + slack_s
    ctx.expect(took <= limit, f"{what}: seconds until the error", f"<= {limit}", round(took, 1))


def optional_case(ctx: CheckContext, what: str, fn: Any, names: tuple[str, ...], kind: str | None = None) -> bool:
    """Run a case the backend may decline: True when it ran; False (with a note) when it was refused
    with an error naming one of ``names`` (the op or dtype it does not support). Any other error fails.

    ``kind`` names what a refusal says is unsupported (an op on a dtype and layout, whatever the group, root or
    size): a backend supports it on every call of the check or on none, so a refusal after it ran once, or a
    run after it was refused, fails (``_same_support``)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - sorted below: a named refusal, or a failure
        text = f"{type(exc).__name__}: {exc}"
        if any(w in text.lower() for w in TIMEOUT_WORDS) or not _names(text, names):
            raise CheckFailed(f"rank {ctx.rank}: {what}: expected a result or a refusal naming one of "
                              f"{list(names)}, observed {text}") from None
        not_an_assert(ctx, what, exc)
        refusal = text.splitlines()[0][:160]
        _same_support(ctx, kind, what, refusal)
        ctx.note(f"{what}: not supported by the target (refused: {refusal})")
        return False
    _same_support(ctx, kind, what, None)
    return True


def refused_before(ctx: CheckContext, kind: str) -> bool:
    """Whether an ``optional_case`` of ``kind`` was refused earlier in this check."""
    return kind in ctx.support and ctx.support[kind][1] is not None


def _same_support(ctx: CheckContext, kind: str | None, what: str, refusal: str | None) -> None:
    """Record whether ``kind`` ran (``refusal`` None) or was refused in this check; a second answer that differs
    from the first fails, naming both calls."""
    if kind is None:
        return
    first_what, first_refusal = ctx.support.setdefault(kind, (what, refusal))
    if (first_refusal is None) != (refusal is None):
        def said(call: str, refused: str | None) -> str:
            return f"{call} was refused ({refused})" if refused is not None else f"{call} ran"
        raise CheckFailed(f"rank {ctx.rank}: {kind}: {said(what, refusal)}, but earlier in this check "
                          f"{said(first_what, first_refusal)}: a backend that has an op runs every call of it "
                          "(any group, root or size) or refuses every call as unsupported, not some")


def sweep_groups(ctx: CheckContext, split_ok: bool = False) -> list[tuple[str, dist.ProcessGroup, list[int]]]:
    """The UCC-style group sweep this rank belongs to: (name, group, global members in group-rank order).

    World, the world made from a reversed rank list (sorted by torch), the world kept in reverse order
    (``UNSORTED``, where torch allows it), both halves, odd and even ranks, and a subgroup of a subgroup (the
    ranks above 0, split from the reversed group when ``split_ok``, else a new_group noted as such); where the
    target takes options, the world given OPTIONS (a backend whose data path reads an option, as NCCL's
    channels read max_ctas, is judged on data there). Every rank creates every group, in the same order, as
    torch requires.
    """
    n, ranks = ctx.world_size, list(range(ctx.world_size))
    mine: list[tuple[str, dist.ProcessGroup, list[int]]] = [("world", dist.group.WORLD, ranks)]
    if "options" in ctx.target.capabilities:
        given = ctx.new_group(ranks, pg_options=options_part(ctx).make(**OPTIONS))
        mine.append((f"world given options {OPTIONS}", given, ranks))
    reversed_group = ctx.new_group(ranks[::-1])
    mine.append(("reversed", reversed_group, ranks))
    unsorted = unsorted_group(ctx)
    if unsorted is not None:
        mine.append((UNSORTED, unsorted, ranks[::-1]))
    half = max(1, n // 2)
    for shape, parts in (("halves", [ranks[:half], ranks[half:]]), ("odd_even", [ranks[0::2], ranks[1::2]])):
        for part in (p for p in parts if p):
            group = ctx.new_group(part)
            if ctx.rank in part:
                mine.append((f"{shape} {part}", group, part))
    upper = ranks[1:] or ranks
    if split_ok:
        sub = dist.split_group(parent_pg=reversed_group, split_ranks=[upper])
        name = f"split of the reversed group {upper}"
    else:
        sub = ctx.new_group(upper)
        name = f"new_group {upper} (no split on this target)"
    if ctx.rank in upper:
        mine.append((name, sub, upper))
    return mine


UNSORTED = "unsorted: new_group(reversed, sort_ranks=False)"


def unsorted_group(ctx: CheckContext) -> dist.ProcessGroup | None:
    """Every rank in reverse order, kept unsorted (new_group(sort_ranks=False), torch >= 2.13: group rank i is
    global rank n - 1 - i, v2.13.0 distributed_c10d.py:5996-5998); None where torch has no sort_ranks or refuses
    it (torch 2.13's torchcomms routing makes new_group with split_group, which sorts: NotImplementedError,
    :5899-5903), noted; None in a world of one rank, where no order differs."""
    if ctx.world_size < 2:
        return None
    if "sort_ranks" not in inspect.signature(dist.new_group).parameters:
        ctx.note(f"no unsorted group: torch {torch.__version__}'s new_group has no sort_ranks")
        return None
    try:
        return ctx.new_group(list(range(ctx.world_size))[::-1], sort_ranks=False)
    except NotImplementedError as exc:
        ctx.note(f"no unsorted group: torch refused new_group(sort_ranks=False): {exc}")
        return None


def post(store: dist.Store, key: str, value: bytes = b"1") -> None:
    """Set ``key`` and return once the store holds it. TCPStore's set sends the key without waiting for a reply
    (torch/csrc/distributed/c10d/TCPStore.cpp, TCPStore::set), so a peer told by other means (a barrier over
    shared memory) could ask through its own connection before the server has read it: measured under load, 53
    of 20000 such checks missed the key. A check on the same connection is answered after the set."""
    store.set(key, value)
    store.check([key])


def positive_control(ctx: CheckContext, seen: bool, what: str) -> None:
    """An absence check's probe must show presence when the thing happens; otherwise NotObservable."""
    if not seen:
        raise NotObservable(f"rank {ctx.rank}: target {ctx.target.name}'s probe did not show {what}, so it "
                            "cannot show its absence either")


class Findings:
    """Failures of the cases of one sweep, collected so that every rank runs every case in lockstep
    (a rank that stopped at its first mismatch would leave its peers waiting in the next collective).

    A case that raises (the backend erred, rather than gave a wrong value) stops the sweep: the ranks may no
    longer agree on what comes next. ``conclude`` then re-raises it, or fails naming it after the mismatches.
    """

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.failures: list[str] = []
        self.raised: Exception | None = None

    def case(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Run one case (unless an earlier one raised); a CheckFailed is recorded and the sweep goes on."""
        if self.raised is not None:
            return
        try:
            fn(*args, **kwargs)
        except CheckFailed as exc:
            self.failures.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - kept, and re-raised or reported by conclude()
            self.raised = exc

    def checkpoint(self) -> None:
        """Conclude now if a case raised: the code that follows issues collectives outside any case."""
        if self.raised is not None:
            self.conclude()

    def conclude(self) -> None:
        """Fail naming the first failed cases (and how many there were); re-raise a case's error."""
        if self.raised is not None and not self.failures:
            raise self.raised
        if self.failures:
            shown = " | ".join(self.failures[:3])
            then = "" if self.raised is None else (f"; then rank {self.ctx.rank}'s sweep stopped at "
                                                  f"{type(self.raised).__name__}: {self.raised}")
            raise CheckFailed(f"{len(self.failures)} case(s) failed: {shown}{then}")


@contextlib.contextmanager
def shared_folder(ctx: CheckContext, name: str) -> Iterator[Path]:
    """A fresh folder (``cf-<name>-*`` in the temp dir) rank 0 makes and every rank learns through the check's
    store; rank 0 removes it once every rank has left the block, passed or not (a FileStore's folder)."""
    if ctx.rank == 0:
        ctx.store.set(f"{name}-folder", tempfile.mkdtemp(prefix=f"cf-{name}-"))
    folder = Path(ctx.store.get(f"{name}-folder").decode())
    try:
        yield folder
    finally:
        ctx.store.set(f"{name}-done/{ctx.rank}", "1")
        if ctx.rank == 0:
            with contextlib.suppress(Exception):
                ctx.store.wait([f"{name}-done/{r}" for r in range(ctx.world_size)], timedelta(seconds=ctx.timeout_s))
            shutil.rmtree(folder, ignore_errors=True)
