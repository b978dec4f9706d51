"""Snapshot and restore the process-wide torch.distributed state a check may change."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.distributed.config as dist_config

_ENV_KEYS = ("TORCH_DISTRIBUTED_USE_TORCHCOMMS", "TORCHCOMM_RANK", "TORCHCOMM_SIZE")


def _backend_attrs() -> dict[str, Any]:
    return {k: v for k, v in vars(dist.Backend).items() if k.isupper() and isinstance(v, str)}


@dataclass
class ProcessState:
    """Backend registration maps, distributed config flags and env vars of one process."""

    backend_list: list[str]
    capability: dict[str, list[str]]
    device_map: dict[str, str]
    type_map: dict[str, Any]
    plugins: dict[str, Any]
    attrs: dict[str, Any]
    config: bytes
    env: dict[str, str | None]

    @classmethod
    def capture(cls) -> ProcessState:
        """Take a snapshot of the current process state."""
        b = dist.Backend
        return cls(
            backend_list=list(b.backend_list),
            capability={k: list(v) if type(v) is list else copy.deepcopy(v)  # lists of device names, mostly
                        for k, v in b.backend_capability.items()},
            device_map=dict(b.default_device_backend_map),
            type_map=dict(b.backend_type_map),
            plugins=dict(b._plugins),
            attrs=_backend_attrs(),
            config=dist_config.save_config(),
            env={k: os.environ.get(k) for k in _ENV_KEYS},
        )

    def restore(self) -> None:
        """Put the snapshot back; destroys any process group the check left behind."""
        if dist.is_initialized():
            dist.destroy_process_group()
        b = dist.Backend
        b.backend_list[:] = self.backend_list
        for live, saved in (
            (b.backend_capability, self.capability),
            (b.default_device_backend_map, self.device_map),
            (b.backend_type_map, self.type_map),
            (b._plugins, self.plugins),
        ):
            live.clear()
            live.update(saved)
        for name in set(_backend_attrs()) - set(self.attrs):
            delattr(b, name)
        for name, value in self.attrs.items():
            setattr(b, name, value)
        dist_config.load_config(self.config)
        for key, value in self.env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
