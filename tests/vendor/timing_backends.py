"""Correct toyccl variants with legal but unusual timing: a check whose plan depends on how fast a peer is
fails them, so each must pass the requirement named for it (tests/vendor/test_timing.py). Importing this module
registers each under its name. Test machinery only."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from toyccl.backend import ToyProcessGroup, register


class LateFirstSendToZero(ToyProcessGroup):
    """Group rank 1's first send to rank 0 is posted 0.6 s late (a slow sender; nothing else differs): a rank
    that sends rank 0 its next message meanwhile has it announced first, so an any-source recv of rank 0's
    that the plan still means for rank 1's message takes that one, as torch's any-source semantics allow."""

    backend_name = "timing_late_send"

    def getBackendName(self) -> str:
        return self.backend_name

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        if self.rank() == 1 and dst == 0 and not getattr(self, "_late_done", False):
            self._late_done = True
            time.sleep(0.6)
        return super().send(tensors, dst, tag)


TIMINGS: dict[str, tuple[type[ToyProcessGroup], str]] = {
    LateFirstSendToZero.backend_name: (LateFirstSendToZero, "P2P-DATA"),
}

for _name, (_cls, _req) in TIMINGS.items():
    register(_name, _cls)
