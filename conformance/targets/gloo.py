"""The gloo target: real torch gloo on CPU, watched by probes that need no cooperation from it."""

from __future__ import annotations

import torch.distributed as dist

from conformance.targets.base import Driver, Target


class GlooTarget(Target):
    """Real torch.distributed gloo on CPU processes.

    A CPU build of torch refuses ``device_id`` for CPU (torch 2.13: "must be an accelerator with an
    index"), so there is no eager device binding (``features`` lacks it: an eager world is refused) and
    hence no split_group (torch 2.13's split_group also refuses without an accelerator); gloo
    has no NCCL-style options object; "cpu:gloo,cuda:gloo" gives one gloo backend for both
    device types. Requirements needing those are what a CPU build cannot exhibit on gloo, and
    stay unjudged. What gloo does is observed from outside (conformance.probes): launches
    through torch's dispatcher, communicator creation through the mesh keys gloo writes to the
    store, warnings through Python's warnings.
    """

    name = "gloo"
    features = frozenset({"custom_backend", "multi_device", "p2p_tags", "p2p_any_source", "p2p_unordered_receives",
                          "bitwise_reductions"})
    probes = ("launches", "store")
    device_types = ("cpu", "cuda")
    default_backend = "cpu:gloo"

    def unavailable_reason(self, world_size: int = 1) -> str | None:
        return None if dist.is_gloo_available() else "this torch build has no gloo"

    def driver(self) -> Driver:
        """The plain driver: lazy worlds (an eager one is refused for lacking ``device_binding``)."""
        return Driver(self)
