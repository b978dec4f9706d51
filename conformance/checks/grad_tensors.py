"""COLL-GRAD-TENSORS: collectives and P2P on tensors that require grad (``nn.Parameter`` leaves), as users broadcast
and all-reduce model parameters (and receive them). Each op runs first on a plain tensor of the same values (the
control: a target that declines the op there is not judged on it), then on the parameter: exact, no autograd error,
still a leaf that requires grad and has no gradient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import reference as ref
from conformance.checks.common import UNSUPPORTED, Findings, default_mode
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

NUMEL = 5
Op = Callable[[CheckContext, torch.Tensor], Any]  # the call on the tensor ``t``; returns what it gathered, if any
# what the op leaves in the tensor it writes, or returns, from every rank's input (``columns``) and this rank:
# exact, the values are chosen for it; None where torch leaves it unspecified
Want = Callable[[list[list[Any]], int, torch.dtype], list[Any] | None]


def _ops(ctx: CheckContext) -> list[tuple[str, Op, bool, Want]]:
    """(what, the call, whether it writes its tensor, the values it must give): every way a backend receives a tensor
    it may write in place (broadcast, all_reduce, reduce) or only read (the inputs of the gathers, reduce_scatter)."""
    n, last = ctx.world_size, ctx.world_size - 1
    shard = NUMEL // n if NUMEL % n == 0 else 1  # reduce_scatter_tensor reads the first shard * n elements

    def gather_tensor(c: CheckContext, t: torch.Tensor) -> Any:
        out = torch.zeros(n * NUMEL, dtype=t.dtype, device=c.device)
        dist.all_gather_into_tensor(out, t)
        return out

    def gather_list(c: CheckContext, t: torch.Tensor) -> Any:
        outs = [torch.zeros(NUMEL, dtype=t.dtype, device=c.device) for _ in range(n)]
        dist.all_gather(outs, t)
        return torch.cat(outs)

    def reduce_scatter(c: CheckContext, t: torch.Tensor) -> Any:
        out = torch.zeros(shard, dtype=t.dtype, device=c.device)
        dist.reduce_scatter_tensor(out, t[:shard * n])
        return out

    def gathered(cols: list[list[Any]], me: int, dtype: torch.dtype) -> list[Any]:
        return [v for col in cols for v in col]

    def scattered(cols: list[list[Any]], me: int, dtype: torch.dtype) -> list[Any]:
        return ref.combine([col[:shard * n] for col in cols], "SUM", dtype)[me * shard:(me + 1) * shard]

    return [
        (f"broadcast from rank {last}", lambda c, t: dist.broadcast(t, last), True, lambda cols, me, dt: cols[last]),
        ("all_reduce SUM", lambda c, t: dist.all_reduce(t), True, lambda cols, me, dt: ref.combine(cols, "SUM", dt)),
        ("all_reduce MAX", lambda c, t: dist.all_reduce(t, op=dist.ReduceOp.MAX), True,
         lambda cols, me, dt: ref.combine(cols, "MAX", dt)),
        # off the root a reduce's tensor is unspecified: gloo uses it as scratch, NCCL leaves it
        ("reduce SUM to rank 0", lambda c, t: dist.reduce(t, 0), True,
         lambda cols, me, dt: ref.combine(cols, "SUM", dt) if me == 0 else None),
        ("all_gather_into_tensor of it", gather_tensor, False, gathered),
        ("all_gather of it", gather_list, False, gathered),
        ("reduce_scatter_tensor of it", reduce_scatter, False, scattered),
    ]


def _one(ctx: CheckContext, what: str, op: Op, writes: bool, want_of: Want, dtype: torch.dtype, salt: int) -> None:
    columns = [ref.values(r, NUMEL, dtype, salt) for r in range(ctx.world_size)]  # every rank's input
    values = columns[ctx.rank]
    plain = ref.tensor(values, dtype, ctx.device)
    try:
        op(ctx, plain)
    except Exception as exc:  # noqa: BLE001 - a declined op is not judged; any other error is the control failing
        if any(word in str(exc) for word in UNSUPPORTED):
            ctx.note(f"{what}: not judged on a parameter, the target declines it on a plain tensor ({exc})")
            return
        raise CheckFailed(f"rank {ctx.rank}: {what} on a plain {ref.dtype_name(dtype)}[{NUMEL}] tensor (the "
                          f"control): {type(exc).__name__}: {exc}") from None
    param = torch.nn.Parameter(ref.tensor(values, dtype, ctx.device))
    label = f"{what} on an nn.Parameter ({ref.dtype_name(dtype)}[{NUMEL}], requires grad)"
    try:
        result = op(ctx, param)
    except Exception as exc:  # noqa: BLE001 - the finding
        raise CheckFailed(f"rank {ctx.rank}: {label}: raised {type(exc).__name__}: {exc} (the same op on a plain "
                          "tensor ran: a backend writes or reads the tensor's data below autograd, as NCCL and "
                          "gloo do)") from None
    got, want = param.detach() if writes else result, want_of(columns, ctx.rank, dtype)
    bad = None if want is None else ref.mismatch(got, want, dtype)
    if bad:
        raise CheckFailed(f"rank {ctx.rank}: {label}: {bad}")
    if not writes:
        kept = ref.mismatch(param.detach(), values, dtype)
        if kept:
            raise CheckFailed(f"rank {ctx.rank}: {label}: the parameter it only reads changed: {kept}")
    _still_a_leaf(ctx, label, param)


def _still_a_leaf(ctx: CheckContext, label: str, param: torch.nn.Parameter) -> None:
    """After the op, the parameter is still a leaf that requires grad, with no grad_fn and no gradient."""
    state = (param.is_leaf, param.requires_grad, param.grad_fn, param.grad)
    if state != (True, True, None, None):
        raise CheckFailed(f"rank {ctx.rank}: {label}: afterwards (is_leaf, requires_grad, grad_fn, grad) = {state}, "
                          "expected (True, True, None, None): a collective or P2P op is not an autograd op")


def _send(ctx: CheckContext, dtype: torch.dtype, salt: int) -> None:
    """Rank 0 sends rank 1 a parameter; rank 1 receives it into a plain tensor."""
    if ctx.rank == 0:
        param = torch.nn.Parameter(ref.tensor(ref.values(0, NUMEL, dtype, salt), dtype, ctx.device))
        try:
            dist.send(param, 1)
        except Exception as exc:  # noqa: BLE001 - the finding
            raise CheckFailed(f"rank 0: send of an nn.Parameter ({ref.dtype_name(dtype)}[{NUMEL}]) to rank 1: "
                              f"raised {type(exc).__name__}: {exc}") from None
    elif ctx.rank == 1:
        got = torch.zeros(NUMEL, dtype=dtype, device=ctx.device)
        dist.recv(got, 0)
        bad = ref.mismatch(got, ref.values(0, NUMEL, dtype, salt), dtype)
        if bad:
            raise CheckFailed(f"rank 1: an nn.Parameter rank 0 sent ({ref.dtype_name(dtype)}[{NUMEL}]): {bad}")


def _recv_into(ctx: CheckContext, dtype: torch.dtype, salt: int) -> None:
    """Rank 0 sends rank 1 plain tensors; rank 1 receives them into nn.Parameters, by recv and by irecv (a
    receive a backend completes on a thread of its own: grad mode and autograd's dispatch state are per thread)."""
    sent = [ref.values(0, NUMEL, dtype, salt + k) for k in range(2)]
    if ctx.rank == 0:
        for values in sent:
            dist.send(ref.tensor(values, dtype, ctx.device), 1)
    elif ctx.rank == 1:
        for k, how in enumerate(("recv", "irecv")):
            param = torch.nn.Parameter(torch.zeros(NUMEL, dtype=dtype, device=ctx.device))
            label = f"{how} from rank 0 into an nn.Parameter ({ref.dtype_name(dtype)}[{NUMEL}], requires grad)"
            try:
                if how == "recv":
                    dist.recv(param, 0)
                else:
                    dist.irecv(param, 0).wait()
            except Exception as exc:  # noqa: BLE001 - the finding
                raise CheckFailed(f"rank 1: {label}: raised {type(exc).__name__}: {exc} (gloo and NCCL write a "
                                  "received tensor below autograd)") from None
            bad = ref.mismatch(param.detach(), sent[k], dtype)
            if bad:
                raise CheckFailed(f"rank 1: {label}: {bad}")
            _still_a_leaf(ctx, label, param)


def check_grad_tensors(ctx: CheckContext) -> None:
    """Every op of ``_ops`` on a parameter, float32 and float64; then a parameter sent from rank 0 to rank 1, and
    plain tensors received by rank 1 into parameters."""
    ctx.init_world(default_mode(ctx))
    found = Findings(ctx)
    for k, dtype in enumerate((torch.float32, torch.float64)):
        for i, (what, op, writes, want_of) in enumerate(_ops(ctx)):
            found.case(_one, ctx, what, op, writes, want_of, dtype, salt=10 * k + i)
        if ctx.world_size >= 2:
            found.case(_send, ctx, dtype, salt=10 * k + 9)
            found.case(_recv_into, ctx, dtype, salt=100 + 10 * k)
        dist.barrier()
    found.conclude()
