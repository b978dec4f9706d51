"""A pure-Python multi-process communicator that registers with torch.distributed like any
out-of-tree backend, and models NCCL's communicator semantics (see README.md).

Usage::

    import simulator
    simulator.register()                       # backend name "sim", device cpu
    dist.init_process_group("cpu:sim", store=store, rank=rank, world_size=n)
    simulator.bind_device(dist.group.WORLD)    # eager init: binds cpu:0 (see shim.py)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from simulator import defects, faults, stacks
from simulator.backend import SimProcessGroup, SimSettings, creator
from simulator.config import ConfigError, SimOptions
from simulator.defects import resolve
from simulator.events import LOG
from simulator.parts import register_backend
from simulator.shim import bind_device, install, uninstall, virtual_device

BACKEND_NAME = "sim"
#: the name a caller registers the ``nccl-lazy`` stack under beside a world of another stack, as torch 2.15
#: registers ``nccl-lazy`` beside ``nccl`` (v2.15.0 distributed_c10d.py:1015): its groups are its own
LAZY_BACKEND_NAME = "sim-lazy"

__all__ = [
    "BACKEND_NAME", "LAZY_BACKEND_NAME", "LOG", "ConfigError", "SimOptions", "SimProcessGroup", "SimSettings",
    "bind_device", "defects", "faults", "register", "stacks", "unregister", "virtual_device",
]


def register(name: str = BACKEND_NAME, *, stack: str = "nccl-legacy", defects: Iterable[str] = (),
             consulted: set[str] | None = None) -> SimSettings:
    """Register the simulator with torch.distributed (extended API, device cpu) and install the shim.

    ``stack`` (a name in ``simulator.stacks.STACKS``) is what the worlds it creates model; ``defects`` are the
    planted defects they have, with those named by SIM_DEFECTS in the environment now (an unknown name is a
    ValueError). Both are resolved here into the backend's classes (``simulator.defects.resolve``, which
    also says what ``consulted`` records): register again to change them. SIM_FAULT is read now too
    (``faults.arm``). Returns the settings registered.
    """
    settings = dataclasses.replace(resolve(stack, defects, consulted), name=name)
    register_backend(name, creator(settings), settings.parts)
    faults.arm()
    install()
    return settings


def unregister() -> None:
    """Remove the shim (the runner restores torch's backend maps itself)."""
    uninstall()
