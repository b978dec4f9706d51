"""Targets: one adapter per stack (sim, gloo, nccl, torchcomms, vendor backends).

Each is a parent-side description (``Target``) whose ``driver()`` is the rank side (``Driver``);
optional abilities are its ``Parts``. The registry (conformance.targets.registry) names them.
"""

from conformance.targets.base import CAPABILITIES, Driver, Parts, Target, Traits, WorldSpec
from conformance.targets.registry import available_targets, make_target

__all__ = ["CAPABILITIES", "Driver", "Parts", "Target", "Traits", "WorldSpec", "available_targets", "make_target"]
