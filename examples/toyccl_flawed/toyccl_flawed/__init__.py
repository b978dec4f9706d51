"""toyccl_flawed: toyccl registered as "toyccl_flawed", with ONE deliberate defect.

``send`` and ``recv`` drop the tag (as NCCL does), so messages between a pair are matched
in order whatever their tags. A backend that declares the ``p2p_tags`` capability must then
fail the suite's P2P-DATA requirement (tagged messages received out of order); one that
does not declare it is not asked about tags. toyccl's conformance hooks are re-exported, so
the flawed twin is observed exactly as toyccl is.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from toyccl import conformance_effective_config, conformance_make_options, conformance_probe
from toyccl.backend import ToyProcessGroup, register

BACKEND_NAME = "toyccl_flawed"


class FlawedProcessGroup(ToyProcessGroup):
    """ToyProcessGroup whose point-to-point ops ignore their tag."""

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        return super().send(tensors, dst, 0)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        return super().recv(tensors, src, 0)


register(BACKEND_NAME, FlawedProcessGroup)

__all__ = ["BACKEND_NAME", "FlawedProcessGroup", "conformance_effective_config", "conformance_make_options",
           "conformance_probe"]
