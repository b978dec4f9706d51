"""The torchcomms target: torch.distributed with ``config.use_torchcomms`` on, over NCCL; worlds, devices,
options and the probe are the NCCL target's, ``effective_config`` is what the torchcomms communicator got.

It cannot see launches (torchcomms records them in its own flight recorder, not c10d's): conformance/targets/
README.md ("The torchcomms target") has the upstream lines.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.config as dist_config

from conformance.probe import Probe
from conformance.targets.base import Parts, WorldSpec
from conformance.targets.nccl import NcclConfigPart, NcclDriver, NcclOptionsPart, NcclTarget
from conformance.torchcomms_hints import HINT_KEYS

_TRUE = ("1", "true", "yes", "y")
_FALSE = ("0", "false", "no", "n")


def _missing_integration() -> list[str]:
    """The names torch 2.13 needs from torchcomms that this install lacks."""
    missing = []
    wrapper = False
    for module in ("torchcomms._comms", "torchcomms._backend_wrapper"):
        try:
            wrapper = wrapper or hasattr(importlib.import_module(module), "_BackendWrapper")
        except Exception:  # the module is absent or fails to import: try the other one  # noqa: BLE001
            continue
    if not wrapper:
        missing.append("torchcomms._comms._BackendWrapper")
    torchcomms = importlib.import_module("torchcomms")
    if not hasattr(torchcomms, "new_comm"):
        missing.append("torchcomms.new_comm")
    try:
        if not hasattr(importlib.import_module("torchcomms.hooks"), "FlightRecorderHook"):
            missing.append("torchcomms.hooks.FlightRecorderHook")
    except Exception:  # noqa: BLE001
        missing.append("torchcomms.hooks.FlightRecorderHook")
    return missing


def _hint_value(text: str) -> Any:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    try:
        return int(text)
    except ValueError:
        return text


class TorchcommsConfigPart(NcclConfigPart):
    """The hints a group's torchcomms communicator got, read as option fields (module doc)."""

    def effective(self, group: dist.ProcessGroup, probe: Probe) -> dict[str, Any] | None:
        backend = group._get_backend(torch.device("cuda"))
        if not hasattr(backend, "get_comm"):
            return super().effective(group, probe)
        hints = dict(backend.get_comm().get_options().hints)
        config: dict[str, Any] = {"hints": hints}
        for field, keys in HINT_KEYS.items():
            raw = next((hints[k] for k in keys if k in hints), None)
            config[field] = None if raw is None else _hint_value(raw)
        return config


class TorchcommsTarget(NcclTarget):
    """torch.distributed over torchcomms' nccl backend (torch's use_torchcomms path)."""

    name = "torchcomms"
    features = NcclTarget.features | {"torchcomms"}
    parts = Parts(options=NcclOptionsPart(), config=TorchcommsConfigPart())
    c10d_records_launches = False
    # the spec's skip_stacks entries for "torchcomms" say which requirements are about another design than this path's
    stack = "torchcomms"

    def unavailable_reason(self, world_size: int = 1) -> str | None:
        """None when torchcomms imports with what torch needs, torch enabled it, and CUDA is usable."""
        try:
            importlib.import_module("torchcomms")
        except Exception as exc:  # the PyPI placeholder raises ImportError on import  # noqa: BLE001
            return f"torchcomms does not import: {type(exc).__name__}: {exc}"
        missing = _missing_integration()
        if missing:
            return f"torchcomms lacks what torch {torch.__version__} needs: {', '.join(missing)}"
        if not getattr(dist.distributed_c10d, "_TORCHCOMM_AVAILABLE", False):
            return f"torch {torch.__version__} did not enable its torchcomms path (its import of it failed)"
        return super().unavailable_reason(world_size)

    def driver(self) -> TorchcommsDriver:
        return TorchcommsDriver(self)

    def environment(self) -> dict[str, Any]:
        """The NCCL target's versions plus torchcomms'."""
        env = super().environment()
        try:
            env["torchcomms"] = version("torchcomms")
        except PackageNotFoundError:
            env["torchcomms"] = None
        return env


class TorchcommsDriver(NcclDriver):
    """As NcclDriver, with use_torchcomms on and TORCHCOMM_RANK/SIZE seeded."""

    def init_world(
        self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec, timeout_s: float
    ) -> dist.ProcessGroup:
        dist_config.use_torchcomms = True
        os.environ["TORCHCOMM_RANK"] = str(rank)
        os.environ["TORCHCOMM_SIZE"] = str(world_size)
        return super().init_world(store, rank, world_size, spec, timeout_s)
