"""Each collective kind as a lazy group's first op: it gives exact data and makes the group's communicator.

ProcessGroupNCCL makes a lazy group's communicator inside ``collective()`` (``getNCCLComm`` of the device's key,
then ``initNCCLComm`` when there is none), which every collective goes through, barrier included (an all_reduce of
one element). A backend whose fast path for one op skips that step leaves the group without a communicator after
that op: its config unapplied, its next ops on a path that was never meant to be the group's first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.common import new_comms, ranked_values
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

WIDTH = 3  # elements each rank gives per slot: values differ by rank and by position


def _values(rank: int, count: int) -> torch.Tensor:
    """Rank ``rank``'s known input (``ranked_values``: 100 * (rank + 1) + position), exact in float32."""
    return torch.tensor(ranked_values(rank, count), dtype=torch.float32)


def _barrier(ctx: CheckContext, group: dist.ProcessGroup, members: list[int]) -> None:
    dist.barrier(group=group)


def _broadcast(ctx: CheckContext, group: dist.ProcessGroup, members: list[int]) -> None:
    root = members[-1]
    t = _values(ctx.rank, WIDTH).to(ctx.device)
    dist.broadcast(t, src=root, group=group)
    ctx.expect_equal(f"broadcast from rank {root}", _values(root, WIDTH).tolist(), t.cpu().tolist())


def _reduce(ctx: CheckContext, group: dist.ProcessGroup, members: list[int]) -> None:
    root = members[-1]
    t = _values(ctx.rank, WIDTH).to(ctx.device)
    dist.reduce(t, dst=root, group=group)
    if ctx.rank == root:
        want = sum(_values(m, WIDTH) for m in members)
        ctx.expect_equal(f"reduce (sum) to rank {root}", want.tolist(), t.cpu().tolist())


def _all_gather(ctx: CheckContext, group: dist.ProcessGroup, members: list[int]) -> None:
    out = torch.zeros(len(members) * WIDTH, device=ctx.device)
    dist.all_gather_into_tensor(out, _values(ctx.rank, WIDTH).to(ctx.device), group=group)
    ctx.expect_equal("all_gather_into_tensor", torch.cat([_values(m, WIDTH) for m in members]).tolist(),
                     out.cpu().tolist())


def _reduce_scatter(ctx: CheckContext, group: dist.ProcessGroup, members: list[int]) -> None:
    n, me = len(members), members.index(ctx.rank)
    out = torch.zeros(WIDTH, device=ctx.device)
    dist.reduce_scatter_tensor(out, _values(ctx.rank, n * WIDTH).to(ctx.device), group=group)
    want = sum(_values(m, n * WIDTH) for m in members)[me * WIDTH:(me + 1) * WIDTH]
    ctx.expect_equal("reduce_scatter_tensor (sum)", want.tolist(), out.cpu().tolist())


def _all_to_all(ctx: CheckContext, group: dist.ProcessGroup, members: list[int]) -> None:
    n, me = len(members), members.index(ctx.rank)
    out = torch.zeros(n * WIDTH, device=ctx.device)
    dist.all_to_all_single(out, _values(ctx.rank, n * WIDTH).to(ctx.device), group=group)
    want = torch.cat([_values(m, n * WIDTH)[me * WIDTH:(me + 1) * WIDTH] for m in members])
    ctx.expect_equal("all_to_all_single", want.tolist(), out.cpu().tolist())


FIRST_OPS: dict[str, Callable[[CheckContext, dist.ProcessGroup, list[int]], None]] = {
    "barrier": _barrier, "broadcast": _broadcast, "reduce": _reduce, "all_gather_into_tensor": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter, "all_to_all_single": _all_to_all,
}


def _of_members(event: dict[str, Any], members: list[int]) -> bool:
    """Whether a communicator event is of exactly ``members``: by its members where the probe records them, else
    by its rank count (``nranks``, what NCCL's log shows)."""
    if event.get("members") is not None:
        return sorted(event["members"]) == sorted(members)
    return event.get("nranks") == len(members)


def expect_first_op_makes_comm(ctx: CheckContext, members: list[int], make: Callable[[], dist.ProcessGroup]) -> None:
    """For each of ``FIRST_OPS``: a new lazy group of ``members`` (made by ``make`` on every rank) whose first op is
    that kind gives exact data, and on each member the probe sees a communicator of exactly the members made by
    it (not a 2-rank P2P one). Every rank runs every op before any fails, so none is left waiting in the next."""
    problems: list[str] = []
    for name, run in FIRST_OPS.items():
        group = make()
        if ctx.rank not in members:
            continue
        since = ctx.probe.mark()
        what = f"a new lazy group of ranks {members} whose first op is {name}"
        try:
            run(ctx, group, members)
        except CheckFailed as exc:
            problems.append(f"{what}: {exc}")
        except Exception as exc:  # noqa: BLE001 - named in the failure; the other kinds still run on every rank
            problems.append(f"rank {ctx.rank}: {what}: {type(exc).__name__}: {exc}")
        made = [e for e in new_comms(ctx, since) if e.get("mode") != "p2p"]
        if not any(_of_members(e, members) for e in made):
            shown = [(e.get("mode"), e.get("members"), e.get("nranks")) for e in made]
            problems.append(f"rank {ctx.rank}: {what}: communicators of its members made by that op: expected one, "
                            f"observed (mode, members, nranks) {shown or 'none'}")
    if problems:
        raise CheckFailed("; ".join(problems))
