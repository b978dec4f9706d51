"""Count and name this host's NVIDIA GPUs through NVML, without initialising CUDA.

Why not torch.cuda: ``torch.cuda.is_available()`` and ``device_count()`` call
``cudaGetDeviceCount`` unless PYTORCH_NVML_BASED_CUDA_CHECK=1, and that poisons fork
(torch 2.15 ``torch/cuda/__init__.py:222-241``, the note on is_available): a rank forked
afterwards fails ``set_device`` with "Cannot re-initialize CUDA in forked subprocess"
(``torch/cuda/__init__.py:603-605``). The parent of the rank pools (pytest, the CLI) uses
this module instead, so that it never touches CUDA.

NVML is the driver's management library (``libnvidia-ml.so.1``); it sees every GPU of the
host. ``CUDA_VISIBLE_DEVICES`` is applied as CUDA applies it: the list is read up to its
first entry that names no device; a repeated device makes the list empty. Entries may be
indices or (prefixes of) ``GPU-<uuid>`` names; ``MIG-`` entries are not resolved here
(the count is then unknown: None).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

_NVML_LIB = "libnvidia-ml.so.1"
_NAME_LEN = 96


class NvmlUnavailable(RuntimeError):
    """NVML is missing on this host or did not initialise."""


@contextmanager
def _nvml() -> Iterator[ctypes.CDLL]:
    try:
        lib = ctypes.CDLL(_NVML_LIB)
    except OSError as exc:
        raise NvmlUnavailable(f"{_NVML_LIB} not found ({exc})") from None
    rc = lib.nvmlInit_v2()
    if rc != 0:
        raise NvmlUnavailable(f"nvmlInit_v2 returned {rc}")
    try:
        yield lib
    finally:
        lib.nvmlShutdown()


def _device_count(lib: ctypes.CDLL) -> int:
    count = ctypes.c_uint(0)
    rc = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    if rc != 0:
        raise NvmlUnavailable(f"nvmlDeviceGetCount_v2 returned {rc}")
    return count.value


def _device_text(lib: ctypes.CDLL, index: int, getter: str) -> str:
    handle = ctypes.c_void_p()
    rc = lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
    if rc != 0:
        raise NvmlUnavailable(f"nvmlDeviceGetHandleByIndex_v2({index}) returned {rc}")
    buf = ctypes.create_string_buffer(_NAME_LEN)
    rc = getattr(lib, getter)(handle, buf, _NAME_LEN)
    if rc != 0:
        raise NvmlUnavailable(f"{getter}({index}) returned {rc}")
    return buf.value.decode("ascii", errors="replace")


def visible_indices(spec: str | None, count: int, uuids: list[str] | None = None) -> list[int] | None:
    """The NVML indices a CUDA_VISIBLE_DEVICES value ``spec`` selects among ``count`` devices.

    None when it cannot be told here (MIG entries, or uuids needed and not given).
    """
    if spec is None:
        return list(range(count))
    chosen: list[int] = []
    for raw in (s.strip() for s in spec.split(",")):
        if not raw:
            break
        if raw.startswith("MIG-"):
            return None
        if raw.lstrip("+-").isdigit():
            index = int(raw)
            if not 0 <= index < count:
                break
        else:
            if uuids is None:
                return None
            matches = [i for i, u in enumerate(uuids) if u.startswith(raw)]
            if len(matches) != 1:
                break
            index = matches[0]
        if index in chosen:
            return []
        chosen.append(index)
    return chosen


def visible_devices() -> list[int] | None:
    """NVML indices of the GPUs CUDA would show this process, in CUDA's order; None when unknown.

    Raises NvmlUnavailable when NVML is missing or does not initialise.
    """
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    with _nvml() as lib:
        count = _device_count(lib)
        needs_uuids = spec is not None and any(
            s.strip() and not s.strip().lstrip("+-").isdigit() and not s.strip().startswith("MIG-")
            for s in spec.split(",")
        )
        uuids = [_device_text(lib, i, "nvmlDeviceGetUUID") for i in range(count)] if needs_uuids else None
    return visible_indices(spec, count, uuids)


def device_names(indices: list[int]) -> list[str]:
    """The product names of the GPUs with these NVML indices."""
    with _nvml() as lib:
        return [_device_text(lib, i, "nvmlDeviceGetName") for i in indices]


def driver_version() -> str:
    """The NVIDIA driver version NVML reports."""
    buf = ctypes.create_string_buffer(_NAME_LEN)
    with _nvml() as lib:
        rc = lib.nvmlSystemGetDriverVersion(buf, _NAME_LEN)
    if rc != 0:
        raise NvmlUnavailable(f"nvmlSystemGetDriverVersion returned {rc}")
    return buf.value.decode("ascii", errors="replace")
