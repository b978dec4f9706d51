"""A pytest plugin (``-p tests.gpu.cuda_tripwire``) that makes any CUDA use in the pytest process raise.

torch.cuda.is_available() and friends poison fork on CUDA builds; the suite's parent must count GPUs
through NVML instead. On a CPU build these calls are harmless, so only a tripwire shows the parent
still makes them.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

_NAMES = ("is_available", "device_count", "init", "_lazy_init", "set_device", "current_device",
          "get_device_name", "get_device_properties", "get_device_capability", "synchronize")


def _trip(name: str) -> Any:
    def tripped(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"CUDA touched in the pytest parent: torch.cuda.{name}()")
    return tripped


for _name in _NAMES:
    setattr(torch.cuda, _name, _trip(_name))
if hasattr(torch._C, "_cuda_getDeviceCount"):
    torch._C._cuda_getDeviceCount = _trip("_C._cuda_getDeviceCount")
print("cuda-tripwire: armed", file=sys.stderr)  # the test that loads this plugin checks this line
