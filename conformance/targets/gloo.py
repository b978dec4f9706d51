"""The gloo target: real torch gloo on CPU, no instrumentation (the probe observes nothing)."""

from __future__ import annotations

import torch.distributed as dist

from conformance.outcomes import Skipped
from conformance.targets.base import Target, WorldSpec


class GlooTarget(Target):
    """Real torch.distributed gloo on CPU processes.

    A CPU build of torch refuses ``device_id`` for CPU, so there is no eager device binding and
    hence no split_group; gloo has no NCCL-style options object; torch exposes no events.
    """

    name = "gloo"

    def unavailable_reason(self) -> str | None:
        return None if dist.is_gloo_available() else "this torch build has no gloo"

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"custom_backend", "multi_device", "p2p_tags", "p2p_any_source"})

    @property
    def device_types(self) -> tuple[str, ...]:
        return ("cpu", "cuda")

    @property
    def default_backend(self) -> str:
        return "cpu:gloo"

    def init_world(self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec,
                   timeout_s: float) -> dist.ProcessGroup:
        if spec.mode == "eager":
            raise Skipped("gloo target lacks capability 'device_binding': torch 2.13 rejects "
                          "device_id=cpu ('must be an accelerator with an index')")
        return self._init_default_group(store, rank, world_size, spec, timeout_s)
