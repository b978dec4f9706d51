"""The environment fingerprint a report records: versions of every layer and the host."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
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


def _suite_commit() -> str | None:
    """The git commit of the suite's checkout (``+dirty`` when it has uncommitted changes), or None for an
    installed copy outside git."""
    root = Path(conformance.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def _cpu() -> str:
    """The CPU model (Linux's /proc/cpuinfo, else platform.processor()) and the CPUs this process may use."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model} ({usable} usable CPUs)"


def collect_environment(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions of python, torch, torchcomms, NCCL/CUDA/driver/GPU (null on CPU), host, CPU, suite (and its git
    commit), spec.

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
        "suite_commit": _suite_commit(),
        "cpu": _cpu(),
        "spec": conformance.SPEC_VERSION,
    }
    env.update(extra or {})
    return env
