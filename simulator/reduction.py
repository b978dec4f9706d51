"""Reduce-op math: combine per-rank contributions in rank order, in a sensible accumulation dtype.

Semantics (documented choices):
- sum/avg/product of float16/bfloat16 accumulate in float32 and round once at the end.
- Integer sum/product wrap around in the tensor's own dtype, like gloo.
- bool: sum and max are logical OR, product and min are logical AND (gloo's C++ bool arithmetic).
- avg is supported for floating and complex dtypes only; integer and bool avg raise (gloo has no AVG).
- min/max are rejected for complex dtypes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

REDUCE_OPS = ("sum", "avg", "product", "min", "max")
_LOW_PRECISION = (torch.float16, torch.bfloat16)

_BINARY: dict[str, Callable[..., Tensor]] = {
    "sum": torch.add,
    "avg": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
}
_BOOL_BINARY: dict[str, Callable[..., Tensor]] = {
    "sum": torch.logical_or,
    "max": torch.logical_or,
    "product": torch.logical_and,
    "min": torch.logical_and,
}


def dtype_name(dtype: torch.dtype) -> str:
    """Return 'float32' for torch.float32."""
    return str(dtype).removeprefix("torch.")


class Kernel:
    """The reduction kernel: combines per-rank contributions, one method per step (a planted defect is a
    subclass overriding one of them, see ``simulator/flaws.py``)."""

    def accum_dtype(self, dtype: torch.dtype, op: str) -> torch.dtype:
        """Return the dtype in which `op` accumulates contributions of `dtype`."""
        if op in ("sum", "avg", "product") and dtype in _LOW_PRECISION:
            return torch.float32
        return dtype

    def binary(self, dtype: torch.dtype, op: str) -> Callable[..., Tensor]:
        """The elementwise function that combines two contributions."""
        return _BOOL_BINARY[op] if dtype == torch.bool else _BINARY[op]

    def average(self, acc: Tensor, count: int) -> None:
        """Turn the sum of ``count`` contributions in ``acc`` into their average."""
        acc.div_(count)

    def reduce_into(self, out: Tensor, srcs: Sequence[Tensor], op: str) -> None:
        """Write op(srcs[0], srcs[1], ...) into `out`, combining left to right (rank order).

        `srcs` must have out's shape and dtype and must not alias `out`.
        """
        acc_dtype = self.accum_dtype(out.dtype, op)
        acc = out if acc_dtype == out.dtype else torch.empty(out.shape, dtype=acc_dtype)
        fn = self.binary(out.dtype, op)
        if len(srcs) == 1:
            acc.copy_(srcs[0])
        elif acc is out:
            fn(srcs[0], srcs[1], out=acc)
        else:
            acc.copy_(srcs[0])
            fn(acc, srcs[1], out=acc)
        for src in srcs[2:]:
            fn(acc, src, out=acc)
        if op == "avg":
            self.average(acc, len(srcs))
        if acc is not out:
            out.copy_(acc)


KERNEL = Kernel()


@functools.cache
def unsupported(dtype: torch.dtype, op: str) -> str | None:
    """Return why `op` cannot reduce tensors of `dtype`, or None when it can."""
    name = dtype_name(dtype)
    if op not in REDUCE_OPS:
        return f"unknown reduce op {op!r} (expected one of {', '.join(REDUCE_OPS)})"
    if op == "avg" and not (dtype.is_floating_point or dtype.is_complex):
        return f"reduce op avg is not supported for {name} (only floating and complex dtypes)"
    if op in ("min", "max") and dtype.is_complex:
        return f"reduce op {op} is not defined for complex dtype {name}"
    try:
        reduce_into(torch.zeros(2, dtype=dtype), [torch.ones(2, dtype=dtype)] * 2, op)
    except (RuntimeError, TypeError) as exc:
        return f"reduce op {op} is not supported for {name} on CPU: {exc}"
    return None


def reduce_into(out: Tensor, srcs: Sequence[Tensor], op: str, kernel: Kernel = KERNEL) -> None:
    """Write op(srcs[0], srcs[1], ...) into `out` with ``kernel`` (the communicator's; default the reference)."""
    kernel.reduce_into(out, srcs, op)
