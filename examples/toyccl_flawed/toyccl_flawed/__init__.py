"""toyccl_flawed: toyccl registered as "toyccl_flawed", with ONE deliberate defect.

``allreduce_coalesced`` (what a ``_coalescing_manager`` block of all_reduce calls on exit)
reduces only the first tensor of the block and leaves the others as they were. The
suite's COAL-SYNC-RESULTS requirement must fail on it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from toyccl.backend import ToyProcessGroup, completed_work, register

BACKEND_NAME = "toyccl_flawed"


class FlawedProcessGroup(ToyProcessGroup):
    """ToyProcessGroup whose allreduce_coalesced reduces only the block's first tensor."""

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        self._allreduce_list(tensors[:1], opts.reduceOp if opts else dist.ReduceOp.SUM)
        return completed_work(tensors)


register(BACKEND_NAME, FlawedProcessGroup)

__all__ = ["BACKEND_NAME", "FlawedProcessGroup"]
