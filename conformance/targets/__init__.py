"""Targets: one adapter per stack (sim, gloo, nccl, torchcomms, vendor backends)."""

from conformance.targets.base import CAPABILITIES, Target, WorldSpec
from conformance.targets.registry import available_targets, make_target

__all__ = ["CAPABILITIES", "Target", "WorldSpec", "available_targets", "make_target"]
