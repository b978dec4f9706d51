"""Helpers shared by checks: group-shape sweeps, event queries, tensors."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed, NotObservable


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


def ranked_tensor(ctx: CheckContext, n: int = 8, dtype: torch.dtype = torch.float32, salt: int = 0) -> torch.Tensor:
    """A tensor whose values identify this rank (and ``salt``)."""
    base = torch.arange(n, dtype=torch.float64) + 100 * (ctx.rank + 1) + 1000 * salt
    return base.to(dtype).to(ctx.device)


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
    """The comm_created event of the world communicator (NotObservable if the probe records no modes)."""
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
    target's own wording (``Target.refusal_words[kind]``, e.g. NCCL's name for a config field)."""
    return (*generic, *getattr(ctx.target, "refusal_words", {}).get(kind, ()))


def expect_raises(ctx: CheckContext, what: str, fn: Any, kinds: tuple[type[BaseException], ...] = (Exception,),
                  contains: tuple[str, ...] = ()) -> BaseException:
    """``fn()`` must raise one of ``kinds`` whose message contains every string of ``contains``."""
    try:
        fn()
    except kinds as exc:
        text = str(exc)
        missing = [c for c in contains if c not in text]
        if missing:
            raise CheckFailed(f"rank {ctx.rank}: {what}: error does not name {missing}: "
                              f"{type(exc).__name__}: {text}") from None
        return exc
    except Exception as exc:  # noqa: BLE001 - wrong exception class is a finding
        raise CheckFailed(f"rank {ctx.rank}: {what}: expected {[k.__name__ for k in kinds]}, observed "
                          f"{type(exc).__name__}: {exc}") from None
    raise CheckFailed(f"rank {ctx.rank}: {what}: expected an error, observed success")
