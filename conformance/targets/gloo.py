"""The gloo target: real torch gloo on CPU, watched by probes that need no cooperation from it."""

from __future__ import annotations

import torch.distributed as dist

from conformance.outcomes import Skipped
from conformance.probe import Probe
from conformance.probes import CombinedProbe, combine
from conformance.probes.launches import LaunchProbe
from conformance.probes.store import RecordingStore, StoreProbe
from conformance.targets.base import Target, WorldSpec


class GlooTarget(Target):
    """Real torch.distributed gloo on CPU processes.

    A CPU build of torch refuses ``device_id`` for CPU, so there is no eager device binding and
    hence no split_group (torch 2.13's split_group also refuses without an accelerator); gloo
    has no NCCL-style options object; "cpu:gloo,cuda:gloo" gives one gloo backend for both
    device types. Requirements needing those are what a CPU build cannot exhibit on gloo, and
    stay unjudged. What gloo does is observed from outside (conformance.probes): launches
    through torch's dispatcher, communicator creation through the mesh keys gloo writes to the
    store, warnings through Python's warnings.
    """

    name = "gloo"

    def __init__(self) -> None:
        self._probe: CombinedProbe | None = None
        self._launches: LaunchProbe | None = None
        self._comms: StoreProbe | None = None
        self._store: RecordingStore | None = None

    def unavailable_reason(self) -> str | None:
        return None if dist.is_gloo_available() else "this torch build has no gloo"

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"custom_backend", "multi_device", "p2p_tags", "p2p_any_source",
                          "observe:launches", "observe:comms", "observe:warnings"})

    @property
    def device_types(self) -> tuple[str, ...]:
        return ("cpu", "cuda")

    @property
    def default_backend(self) -> str:
        return "cpu:gloo"

    def setup(self, rank: int, world_size: int) -> None:
        """Start the launch probe on this rank."""
        self._launches = LaunchProbe().install()
        self._comms = StoreProbe()
        self._probe = combine(self._launches, self._comms)

    def init_world(self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec,
                   timeout_s: float) -> dist.ProcessGroup:
        if spec.mode == "eager":
            raise Skipped("gloo target lacks capability 'device_binding': torch 2.13 rejects "
                          "device_id=cpu ('must be an accelerator with an index')")
        if self._comms is not None:
            store = self._store = RecordingStore(store, self._comms)  # torch keeps only its C++ half alive
        return self._init_default_group(store, rank, world_size, spec, timeout_s)

    def probe(self) -> Probe:
        """Launches from the dispatcher, communicators from the store (see conformance.probes)."""
        if self._probe is None:
            self.setup(0, 0)
        assert self._probe is not None
        return self._probe

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if self._probe is not None:
                self._probe.close()
            self._probe = self._launches = self._comms = self._store = None
