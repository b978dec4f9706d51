"""The environment fingerprint a report records: versions of every layer and the host."""

from __future__ import annotations

import platform
import shutil
import subprocess
from typing import Any

import torch

import conformance


def _torchcomms_version() -> str | None:
    # The PyPI "torchcomms" is a placeholder whose import raises; treat any failure as absent.
    try:
        import torchcomms
    except Exception:  # noqa: BLE001
        return None
    return str(getattr(torchcomms, "__version__", "unknown"))


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def _cuda_fields() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"nccl": None, "cuda": None, "driver": None, "gpu": None, "gpu_count": 0}
    try:
        nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001
        nccl = None
    return {
        "nccl": nccl,
        "cuda": torch.version.cuda,
        "driver": _driver_version(),
        "gpu": torch.cuda.get_device_name(0),
        "gpu_count": torch.cuda.device_count(),
    }


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
