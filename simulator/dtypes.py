"""Dtype names on the wire (envelopes read back from a store) resolved through an explicit table, never getattr."""

from __future__ import annotations

import torch

from simulator.reduction import dtype_name

# Every torch.dtype this torch build defines, by its canonical name ('float32', 'bfloat16', ...).
DTYPES: dict[str, torch.dtype] = {dtype_name(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def dtype_from_name(name: object) -> torch.dtype:
    """The dtype called ``name``; ValueError naming it if it is not a dtype of this torch build."""
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise ValueError(f"unknown dtype name {name!r} in a message read from the store")
    return dtype
