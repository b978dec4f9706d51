"""Exact references for data checks: every rank's input is known, so every rank computes the expected
output itself, in Python integers or float64 on values every dtype represents exactly, never from
another output of the backend under test (see conformance/checks/README.md).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

INT_BIG = 2**40  # int64 inputs sit above 2**24 and 2**32: an accumulation through float32 or int32 shows
_POW2 = (1.0, -1.0, 2.0, 0.5, -2.0, 1.0, -0.5)  # products of these are powers of two: exact in every float dtype

REDUCE_OPS: dict[str, Any] = {name: getattr(dist.ReduceOp, name)
                              for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")}
BITWISE = ("BAND", "BOR", "BXOR")


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32."""
    return str(dtype).removeprefix("torch.")


def values(rank: int, numel: int, dtype: torch.dtype, salt: int = 0, op: str = "SUM") -> list[Any]:
    """Rank ``rank``'s known input for a case: exact in ``dtype`` and exact through ``op`` over up to 8 ranks."""
    out: list[Any] = []
    for i in range(numel):
        k = rank * 3 + i * 5 + salt * 7
        if dtype == torch.bool:
            out.append((k + rank) % 3 == 0)
        elif dtype == torch.uint8:
            out.append(k % 31 + 1)
        elif not dtype.is_floating_point:
            if op == "PRODUCT":
                out.append(k % 3 + 1)
            else:
                sign = -1 if (rank + i) % 2 else 1
                out.append(sign * (INT_BIG + rank * 2**33 + k))
        elif op == "PRODUCT":
            out.append(_POW2[k % len(_POW2)])
        else:
            out.append(float(k % 9 - 4))
    return out


def tensor(vals: Sequence[Any], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``vals`` as a tensor of ``dtype`` on ``device`` (exact: the values were chosen for it)."""
    return torch.tensor(list(vals), dtype=dtype, device=device)


def combine(columns: Sequence[Sequence[Any]], op: str, dtype: torch.dtype) -> list[Any]:
    """The exact elementwise reduction of each rank's values (rank order), as ``dtype`` would hold it."""
    result = []
    for column in zip(*columns):
        if dtype == torch.bool:
            value: Any = {"SUM": any, "MAX": any, "BOR": any, "PRODUCT": all, "MIN": all, "BAND": all,
                          "BXOR": lambda c: sum(c) % 2 == 1}[op](column)
        elif op in ("SUM", "AVG"):
            value = sum(column)
            if op == "AVG":
                value = value / len(column)
        elif op == "PRODUCT":
            value = functools.reduce(operator.mul, column)
        elif op == "MIN":
            value = min(column)
        elif op == "MAX":
            value = max(column)
        else:
            value = functools.reduce({"BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor}[op], column)
        if op != "AVG" and dtype != torch.bool and not (dtype.is_floating_point or dtype.is_complex):
            value = wrapped(value, dtype)
        result.append(value)
    return result


def wrapped(value: int, dtype: torch.dtype) -> int:
    """``value`` as the fixed-width integer ``dtype`` holds it: modulo 2**bits, two's complement for signed types
    (what the kernels of NCCL and gloo, which add in the dtype, and torch's own integer ops give)."""
    info = torch.iinfo(dtype)
    return (int(value) - info.min) % (info.max - info.min + 1) + info.min


def as_dtype(vals: Sequence[Any], dtype: torch.dtype) -> list[Any]:
    """Exact values rounded once to ``dtype`` (what a correctly rounded result holds)."""
    if not dtype.is_floating_point:
        return list(vals)
    return torch.tensor(list(vals), dtype=torch.float64).to(dtype).double().tolist()


def mismatch(got: torch.Tensor, want: Sequence[Any], dtype: torch.dtype, ulps: int = 0) -> str | None:
    """None when ``got`` holds ``want`` (exactly, or within ``ulps`` units of ``dtype``), else a short diff."""
    observed = got.detach().cpu().reshape(-1)
    observed_list = observed.double().tolist() if dtype.is_floating_point else observed.tolist()
    expected = as_dtype(want, dtype)
    if len(observed_list) != len(expected):
        return f"{len(expected)} elements expected, {len(observed_list)} observed"
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0
    bad = [i for i, (o, e) in enumerate(zip(observed_list, expected))
           if (o != e if not ulps else abs(o - e) > ulps * eps * max(1.0, abs(e)))]
    if not bad:
        return None
    first = bad[:4]
    return (f"{len(bad)} of {len(expected)} elements differ; at {first}: expected "
            f"{[expected[i] for i in first]}, observed {[observed_list[i] for i in first]}")
