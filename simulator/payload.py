"""Tensor payloads in flat shared buffers: sizes, packing offsets, typed views, descriptions."""

from __future__ import annotations

import torch
from torch import Tensor

from simulator.reduction import dtype_name

ALIGN = 64


def tdesc(t: Tensor) -> str:
    """'float32[2,3]' for a tensor."""
    return f"{dtype_name(t.dtype)}[{','.join(map(str, t.shape))}]"


def nbytes(t: Tensor) -> int:
    """Bytes of the tensor's elements."""
    return t.numel() * t.element_size()


def offsets(sizes: list[int]) -> tuple[list[int], int]:
    """Byte offsets of payloads of these byte sizes packed into one buffer (each aligned), and the total."""
    offs, pos = [], 0
    for size in sizes:
        offs.append(pos)
        pos += -(-size // ALIGN) * ALIGN
    return offs, pos


def layout(tensors: list[Tensor]) -> tuple[list[int], int]:
    """Offsets of ``tensors`` packed into one buffer (each aligned), and the total size."""
    return offsets([nbytes(t) for t in tensors])


def typed(buf: Tensor | None, off: int, dtype: torch.dtype, numel: int) -> Tensor:
    """A flat ``dtype`` view of ``numel`` elements of the uint8 buffer ``buf`` at byte offset ``off``."""
    if numel == 0 or buf is None:
        return torch.empty(0, dtype=dtype)
    size = numel * torch.empty(0, dtype=dtype).element_size()
    return buf[off:off + size].view(dtype)
