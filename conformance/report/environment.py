"""The environment fingerprint a report records: versions of every layer and the host."""

from __future__ import annotations

import contextlib
import platform
from typing import Any

import torch

import conformance
from conformance.gpu import devices


def _torchcomms_version() -> str | None:
    # The PyPI "torchcomms" is a placeholder whose import raises; treat any failure as absent.
    try:
        import torchcomms
    except Exception:  # noqa: BLE001
        return None
    return str(getattr(torchcomms, "__version__", "unknown"))


def _cuda_fields() -> dict[str, Any]:
    """CUDA, NCCL, driver and GPU through NVML and version calls: this runs in the parent of the
    rank pools, which must not initialise CUDA (see conformance.gpu.devices)."""
    fields: dict[str, Any] = {"nccl": None, "cuda": torch.version.cuda, "driver": None, "gpu": None, "gpu_count": 0}
    if torch.distributed.is_available() and torch.distributed.is_nccl_available():
        with contextlib.suppress(Exception):
            fields["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
    try:
        visible = devices.visible_devices()
        fields["driver"] = devices.driver_version()
        if visible:
            fields["gpu"] = devices.device_names(visible[:1])[0]
            fields["gpu_count"] = len(visible)
    except devices.NvmlUnavailable:
        pass
    return fields


def collect_environment(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions of python, torch, torchcomms, NCCL/CUDA/driver/GPU (null on CPU), host, suite, spec.

    ``extra`` (e.g. a vendor backend's package name and version) is merged in last.
    """
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchcomms": _torchcomms_version(),
        **_cuda_fields(),
        "host": platform.node(),
        "platform": platform.platform(),
        "suite": conformance.__version__,
        "spec": conformance.SPEC_VERSION,
    }
    env.update(extra or {})
    return env
