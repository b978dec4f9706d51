"""Tasks run in pool ranks by tests: report the process-wide torch.distributed state of a rank."""

from typing import Any

import torch.distributed as dist
import torch.distributed.config as dist_config


def snapshot(rank: int, world_size: int, store: Any) -> dict[str, Any]:
    """Backend maps, the torchcomms flag and whether a default group exists, on this rank."""
    return {
        "backend_list": list(dist.Backend.backend_list),
        "capability": {k: list(v) for k, v in dist.Backend.backend_capability.items()},
        "device_map": dict(dist.Backend.default_device_backend_map),
        "plugins": sorted(dist.Backend._plugins),
        "use_torchcomms": dist_config.use_torchcomms,
        "initialized": dist.is_initialized(),
    }
