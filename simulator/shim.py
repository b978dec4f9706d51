"""The narrowest shim that lets torch's own split_group run on CPU against the simulator.

What it patches, and why (torch 2.13 CPU build):

1. ``bind_device(pg)``: torch refuses ``init_process_group(device_id=cpu)`` ("must be an
   accelerator with an index"), and new_group refuses a cpu bound device for the same reason,
   so eager init cannot be requested through torch on CPU. The shim sets
   ``pg.bound_device_id = meta:0`` (torch's own attribute; ``meta`` is a built-in device type
   that never holds data, so nothing can be placed on it by mistake, and unlike a renamed
   PrivateUse1 it needs no device hooks when barrier() copies it into its options) and asks
   the simulator to create the group communicator now, which is what
   ``eager_connect_single_device`` does for NCCL. Data stays on the CPU. Nothing of torch is
   replaced.
2. ``torch.distributed.split_group`` (and the module attribute in distributed_c10d, which
   new_group's torchcomms path calls) is wrapped. Only while a split of a *simulator* group
   runs, ``torch.accelerator.is_available`` reports True and ``current_accelerator``
   returns ``cpu``, because split_group looks the parent backend up by the current
   accelerator and refuses outright when there is none. Every check torch makes before that
   (empty split, unbound default group, group membership) and after (validation, naming,
   registration of the child) runs unchanged. Splits of non-simulator groups call the
   original function untouched.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from simulator import defects

VIRTUAL_DEVICE = torch.device("meta", 0)


def virtual_device() -> torch.device:
    """The virtual device a simulator world is bound to: ``meta:0`` (a device type that holds no data)."""
    return VIRTUAL_DEVICE
_original: Callable[..., Any] | None = None


def bind_device(pg: dist.ProcessGroup, device: torch.device | None = None) -> None:
    """Bind ``pg`` to a virtual device and create its communicator eagerly."""
    device = device or virtual_device()
    pg.bound_device_id = device
    pg.eager_connect_single_device(device)


@contextlib.contextmanager
def virtual_accelerator() -> Iterator[None]:
    """Make torch believe the CPU is the current accelerator, for the duration of the block."""
    with mock.patch.object(torch.accelerator, "is_available", return_value=True), \
            mock.patch.object(torch.accelerator, "current_accelerator", return_value=torch.device("cpu")):
        yield


def _is_sim(pg: Any) -> bool:
    from simulator.backend import SimProcessGroup

    return isinstance(pg, SimProcessGroup)


def _split_group(*args: Any, **kwargs: Any) -> Any:
    assert _original is not None
    if not dist.is_initialized():
        return _original(*args, **kwargs)
    default = c10d._get_default_group()
    parent = kwargs.get("parent_pg", args[0] if args else None) or default
    if not _is_sim(parent):
        return _original(*args, **kwargs)
    with contextlib.ExitStack() as stack:
        if defects.active("split_unbound_allowed") and default.bound_device_id is None:
            default.bound_device_id = virtual_device()
            stack.callback(setattr, default, "bound_device_id", None)
        stack.enter_context(virtual_accelerator())
        return _original(*args, **kwargs)


def install() -> None:
    """Wrap split_group (idempotent)."""
    global _original
    if _original is not None:
        return
    _original = c10d.split_group
    wrapper = functools.wraps(_original)(_split_group)
    c10d.split_group = wrapper
    dist.split_group = wrapper


def uninstall() -> None:
    """Restore torch's split_group."""
    global _original
    if _original is None:
        return
    c10d.split_group = _original
    dist.split_group = _original
    _original = None
