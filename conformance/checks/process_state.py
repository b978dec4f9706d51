"""API-PROCESS-STATE: using the backend leaves the process-wide state its user owns as the user set it.

A backend runs inside the training process: a mode it switches for its own work (grad mode to write results, a
flush-to-zero mode for speed, the RNG for a random algorithm, a signal handler to abort) and does not put back
changes every computation of the user's after it, with no error. Each piece of state has a reader and a flip; the
check first shows every reader sees its flip (then undoes it), then reads them all before init_process_group and
after a run of every op family and of calls the backend must refuse (its error path must put back what it switched).
"""

from __future__ import annotations

import hashlib
import random
import signal
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.common import UNSUPPORTED, default_mode, optional_case
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

USER_SEED = 1234
SUBNORMAL = 1e-40  # a float32 subnormal (the smallest normal is about 1.18e-38): x * 1 keeps it unless flushed


def _digest(raw: bytes) -> str:
    return hashlib.sha1(raw).hexdigest()[:12]


def _subnormals_kept() -> bool:
    return bool((torch.tensor([SUBNORMAL], dtype=torch.float32) * 1.0).item() != 0.0)


def _flip_grad() -> Callable[[], None]:
    was = torch.is_grad_enabled()
    torch.set_grad_enabled(not was)
    return lambda: torch.set_grad_enabled(was)


def _flip_dtype() -> Callable[[], None]:
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if was != torch.float64 else torch.float32)
    return lambda: torch.set_default_dtype(was)


def _flip_threads() -> Callable[[], None]:
    was = torch.get_num_threads()
    torch.set_num_threads(was + 1)
    return lambda: torch.set_num_threads(was)


def _flip_flush() -> Callable[[], None]:
    was_kept = _subnormals_kept()
    torch.set_flush_denormal(was_kept)
    return lambda: torch.set_flush_denormal(not was_kept)


def _flip_matmul() -> Callable[[], None]:
    was = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if was != "high" else "highest")
    return lambda: torch.set_float32_matmul_precision(was)


def _flip_rng() -> Callable[[], None]:
    saved = torch.get_rng_state()
    torch.rand(1)
    return lambda: torch.set_rng_state(saved)


def _flip_random() -> Callable[[], None]:
    saved = random.getstate()
    random.random()
    return lambda: random.setstate(saved)


def _flip_signal(sig: signal.Signals) -> Callable[[], Callable[[], None]]:
    def flip() -> Callable[[], None]:
        was = signal.getsignal(sig)
        signal.signal(sig, lambda *_: None)
        return lambda: signal.signal(sig, was)
    return flip


# (what, read it, change it and return the undo)
STATE: tuple[tuple[str, Callable[[], Any], Callable[[], Callable[[], None]]], ...] = (
    ("torch.is_grad_enabled()", torch.is_grad_enabled, _flip_grad),
    ("torch.get_default_dtype()", torch.get_default_dtype, _flip_dtype),
    ("torch.get_num_threads()", torch.get_num_threads, _flip_threads),
    (f"a float32 subnormal ({SUBNORMAL}) kept by x * 1 (not flushed to zero)", _subnormals_kept, _flip_flush),
    ("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision, _flip_matmul),
    ("torch's CPU RNG state (digest)", lambda: _digest(torch.get_rng_state().numpy().tobytes()), _flip_rng),
    ("Python's random state (digest)", lambda: _digest(repr(random.getstate()).encode()), _flip_random),
    ("the SIGINT handler", lambda: signal.getsignal(signal.SIGINT), _flip_signal(signal.SIGINT)),
    ("the SIGTERM handler", lambda: signal.getsignal(signal.SIGTERM), _flip_signal(signal.SIGTERM)),
)


def _user_settings() -> None:
    """What the user sets before init here (the defaults, and seeded RNGs): a change an earlier check's backend
    calls already made (flushing subnormals is idempotent) would otherwise be the check's own starting point."""
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)
    torch.set_flush_denormal(False)
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(USER_SEED)
    random.seed(USER_SEED)


def read_state() -> dict[str, Any]:
    """Every piece of ``STATE``, read now."""
    return {what: read() for what, read, _ in STATE}


def _readers_see_flips(ctx: CheckContext) -> list[str]:
    """The positive control: each reader sees its flip, and the undo puts the value back. Returns the pieces whose
    flip this host cannot make (set_flush_denormal is a no-op without SSE3): those are not judged."""
    blind: list[str] = []
    for what, read, flip in STATE:
        before = read()
        undo = flip()
        try:
            changed = read() != before
        finally:
            undo()
        if not changed and "subnormal" in what:
            blind.append(what)
            continue
        ctx.expect(changed, f"positive control: {what} after changing it", "a different value", before)
        ctx.expect_equal(f"positive control: {what} after undoing the change", before, read())
    return blind


def _every_op_family(ctx: CheckContext) -> None:
    """One call of each op family on the world, a new_group and (between neighbours) P2P; an op the target
    declines with a refusal naming it is noted, any other error fails."""
    n, r, dev = ctx.world_size, ctx.rank, ctx.device
    mine = torch.full((4,), float(r + 1), device=dev)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("all_reduce", lambda: dist.all_reduce(mine.clone())),
        ("all_reduce of float32 subnormals", lambda: dist.all_reduce(torch.full((4,), SUBNORMAL, device=dev))),
        ("broadcast", lambda: dist.broadcast(mine.clone(), src=n - 1)),
        ("reduce", lambda: dist.reduce(mine.clone(), dst=0)),
        ("all_gather", lambda: dist.all_gather([torch.zeros(4, device=dev) for _ in range(n)], mine)),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.zeros(4 * n, device=dev), mine)),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.zeros(4, device=dev),
                                                                     torch.ones(4 * n, device=dev))),
        ("all_to_all_single", lambda: dist.all_to_all_single(torch.zeros(2 * n, device=dev),
                                                             torch.ones(2 * n, device=dev))),
        ("async all_reduce, waited through its future", lambda: dist.all_reduce(mine.clone(), async_op=True)
         .get_future().wait()),
        ("barrier", dist.barrier),
    ]
    for what, call in calls:
        optional_case(ctx, what, call, (*UNSUPPORTED, what.split()[0]))
    if n > 1:
        right, left = (r + 1) % n, (r - 1) % n
        got = torch.zeros(4, device=dev)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, got, left)])
        for work in works:
            work.wait()
    group = ctx.new_group(list(range(n)))
    dist.all_reduce(mine.clone(), group=group)
    dist.barrier()
    _refused_calls(ctx)


def _refused_calls(ctx: CheckContext) -> None:
    """Calls the backend itself must refuse (torch's front end passes them: it checks neither sizes nor splits), made
    alike on every rank so that one that is not refused cannot leave a peer waiting: a backend's error path must put
    back what it switched too (grad mode set off around its work and not restored when it raises). A call that is not
    refused is noted; COLL-BAD-ARGS-REFUSED judges that."""
    n, dev = ctx.world_size, ctx.device
    calls: list[tuple[str, Callable[[], Any]]] = [
        (f"all_gather_into_tensor into an output of {4 * n + 1} elements for inputs of 4",
         lambda: dist.all_gather_into_tensor(torch.zeros(4 * n + 1, device=dev), torch.ones(4, device=dev))),
        (f"all_to_all_single of {2 * n} elements with input splits summing to {2 * n + 1}",
         lambda: dist.all_to_all_single(torch.zeros(2 * n, device=dev), torch.ones(2 * n, device=dev),
                                        output_split_sizes=[2] * n, input_split_sizes=[2] * (n - 1) + [3])),
    ]
    for what, call in calls:
        try:
            call()
        except Exception:  # noqa: BLE001 - the refusal is the path under test, whatever it says
            continue
        ctx.note(f"{what}: not refused (COLL-BAD-ARGS-REFUSED judges that)")
    dist.barrier()


def check_process_state(ctx: CheckContext) -> None:
    """Grad mode, default dtype, threads, denormal flushing, matmul precision, both RNGs and the SIGINT/SIGTERM
    handlers are, after init, a run of every op family and calls it refuses, what the user set before init."""
    blind = _readers_see_flips(ctx)
    _user_settings()
    before = read_state()
    ctx.init_world(default_mode(ctx))
    _every_op_family(ctx)
    after = read_state()
    changed = {what: (before[what], after[what]) for what in before
               if what not in blind and before[what] != after[what]}
    if changed:
        raise CheckFailed(f"rank {ctx.rank}: process-wide state changed by init_process_group, a run of every op "
                          "family and calls it refused (expected each as before, observed before -> after): "
                          + "; ".join(f"{what}: {was!r} -> {now!r}" for what, (was, now) in changed.items()))
    for what in blind:
        ctx.note(f"{what}: not judged, this host cannot flush subnormals (torch.set_flush_denormal is a no-op)")
