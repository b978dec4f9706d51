"""A backend for the torchrun crash test: toyccl, except that rank 1's process dies of SIGSEGV in barrier().

Loaded by the vendor target (``--target vendor --target-option module=tests.gpu.crashing_backend``); every other
op is toyccl's, so the checks that use no barrier pass."""

from __future__ import annotations

import ctypes
from typing import Any

import torch.distributed as dist
from toyccl.backend import ToyProcessGroup, register

BACKEND = "toyccl_barrier_segv"


class BarrierSegfault(ToyProcessGroup):
    """Rank 1 reads address 0 in barrier(): the process is killed by SIGSEGV, as a native backend's crash."""

    def getBackendName(self) -> str:
        return BACKEND

    def barrier(self, opts: Any = None) -> dist.Work:
        if self.rank() == 1:
            ctypes.string_at(0)
        return super().barrier(opts)


register(BACKEND, BarrierSegfault)
