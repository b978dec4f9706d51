"""The classes a simulator backend builds its objects from, chosen once when it is registered.

The reference classes hold the correct behaviour only. A stack (``simulator/stacks.py``) and a planted
defect (``simulator/flaws.py``) are subclasses of them, composed by ``simulator.defects.resolve`` into one
``Parts`` value that the backend's groups, communicators and works carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from simulator.fabric import Fabric
from simulator.p2p import P2PPlane
from simulator.reduction import KERNEL, Kernel
from simulator.work import SimWork


class Creator:
    """What the backend tells torch when it is registered, and what its creator does with the options
    torch passes it."""

    def devices(self) -> list[str] | None:
        """The device types the backend registers for."""
        return ["cpu"]

    def registered(self, name: str) -> None:
        """Called once the backend is registered as ``name``."""

    def world_options(self, options: Any) -> Any:
        """The options a world's group is created with, from those given to init_process_group."""
        return options

    def subgroup_options(self, options: Any) -> Any:
        """The options a subgroup is created with, from those given to new_group."""
        return options


CREATOR = Creator()


def register_backend(name: str, creator: Any, parts: Parts) -> None:
    """``Backend.register_backend`` for the simulator, as ``parts.creator`` says."""
    dist.Backend.register_backend(name, creator, extended_api=True, devices=parts.creator.devices())
    parts.creator.registered(name)


@dataclass(frozen=True)
class Parts:
    """One backend's classes (and the kernel and creator instances made from its classes)."""

    fabric: type[Fabric] = Fabric
    p2p: type[P2PPlane] = P2PPlane
    work: type[SimWork] = SimWork
    p2p_work: type[SimWork] = SimWork
    kernel: Kernel = KERNEL
    creator: Creator = CREATOR


REFERENCE = Parts()
