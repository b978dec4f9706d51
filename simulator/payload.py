"""Tensor payloads in flat shared buffers: sizes, packing offsets, typed views, descriptions, and the
text form of a small payload carried inline in a store record."""

from __future__ import annotations

import base64
import ctypes

import torch
from torch import Tensor

from simulator.reduction import dtype_name

ALIGN = 64


def tdesc(t: Tensor) -> str:
    """'float32[2,3]' for a tensor."""
    return f"{dtype_name(t.dtype)}[{','.join(map(str, t.shape))}]"


def misfit(whole: str, big: Tensor, part: str, small: Tensor, n: int) -> str | None:
    """Why ``big`` (named ``whole``) cannot hold ``n`` x ``small`` (named ``part``), or None when it can."""
    if big.dtype != small.dtype:
        return f"{whole} {tdesc(big)} and {part} {tdesc(small)} differ in dtype"
    if big.numel() != n * small.numel():
        return f"{whole} {tdesc(big)} has the wrong size: it must hold {n} x {part} {tdesc(small)}"
    return None


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
    size = numel * dtype.itemsize
    return buf[off:off + size].view(dtype)


def pack_into(buf: Tensor, tensors: list[Tensor], offs: list[int],
              skip: dict[int, tuple[int, int]] | None = None) -> None:
    """Copy ``tensors`` into the uint8 buffer ``buf`` at ``offs``; ``skip`` maps the index of a contiguous
    tensor to a flat element range [lo, hi) that is left out (its owner reads it from the tensor itself)."""
    for k, (t, off) in enumerate(zip(tensors, offs, strict=True)):
        dst = typed(buf, off, t.dtype, t.numel())
        if skip is None or k not in skip:
            dst.view(t.shape).copy_(t)
            continue
        lo, hi = skip[k]
        flat = t.view(-1)
        dst[:lo].copy_(flat[:lo])
        dst[hi:].copy_(flat[hi:])


def pack(tensors: list[Tensor], offs: list[int], total: int) -> Tensor:
    """``tensors`` packed at ``offs`` into a new uint8 buffer of ``total`` bytes."""
    buf = torch.zeros(total, dtype=torch.uint8)
    pack_into(buf, tensors, offs)
    return buf


def to_text(buf: Tensor) -> str:
    """The base64 text of a contiguous uint8 buffer (what an inline record carries); numpy is optional
    for torch, so the bytes are read through ctypes."""
    assert buf.dtype == torch.uint8 and buf.is_contiguous()
    return base64.b64encode(ctypes.string_at(buf.data_ptr(), buf.numel())).decode("ascii")


def from_text(text: str) -> Tensor:
    """The uint8 buffer ``to_text`` encoded."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
