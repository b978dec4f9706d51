"""The target interface: how to init a world on a stack, and what it can observe."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from conformance.probe import NullProbe, Probe

# Capabilities a requirement can need. "observe:*" ones are about what the probe can see:
# a target without one reports not-observable; without any other one it reports skip.
CAPABILITIES: dict[str, str] = {
    "device_binding": "an eager device binding at init (device_id)",
    "split": "torch.distributed.split_group on a bound parent",
    "options": "process-group options objects carrying NCCL-style fields",
    "hints": "a hints map (torchcomms CommOptions.hints names) on the options object",
    "multi_device": "two device types in one process group",
    "custom_backend": "registering an out-of-tree backend in the rank processes",
    "torchcomms": "the torchcomms integration path",
    "coalesced_p2p": "batch_isend_irecv coalesced into one backend launch",
    "p2p_tags": "send/recv tags that select among messages (NCCL ignores tags)",
    "p2p_any_source": "recv(src=None) from whichever peer sends",
    "observe:comms": "communicator creation events",
    "observe:launches": "op launch events (per communicator and stream)",
    "observe:config": "the effective config of a communicator",
    "observe:warnings": "warnings issued by the backend",
}


@dataclass
class WorldSpec:
    """How a check wants its world: eager (device-bound) or lazy, backend string, options."""

    mode: str = "eager"
    backend: str | None = None
    pg_options: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class Target(abc.ABC):
    """An adapter for one stack. One instance per rank process."""

    name: str = ""
    gpu: bool = False

    @abc.abstractmethod
    def unavailable_reason(self) -> str | None:
        """None when this target can run here, else one line saying why not."""

    @property
    @abc.abstractmethod
    def capabilities(self) -> frozenset[str]:
        """The entries of CAPABILITIES this target has."""

    @property
    def default_backend(self) -> str:
        """The backend string a plain world uses."""
        return self.name

    @property
    def device_types(self) -> tuple[str, ...]:
        """Device types the target's backend serves (what its bare name must expand to)."""
        return ("cpu",)

    def device(self, rank: int) -> torch.device:
        """The device this rank's tensors live on."""
        return torch.device("cpu")

    def setup(self, rank: int, world_size: int) -> None:  # noqa: B027 - optional hook
        """Prepare the rank process before a check (register backends, env vars)."""

    @abc.abstractmethod
    def init_world(
        self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec, timeout_s: float
    ) -> dist.ProcessGroup:
        """Initialise the default process group as ``spec`` asks and return it."""

    def _init_default_group(self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec,
                            timeout_s: float, device_id: torch.device | None = None) -> dist.ProcessGroup:
        """init_process_group with the spec's backend (or the target's default) and options."""
        if spec.mode not in ("eager", "lazy"):
            raise ValueError(f"unknown world mode {spec.mode!r}; expected 'eager' or 'lazy'")
        dist.init_process_group(
            backend=spec.backend or self.default_backend, store=store, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s), pg_options=spec.pg_options, device_id=device_id,
        )
        return dist.group.WORLD

    def make_options(self, **fields: Any) -> Any:
        """A backend options object carrying NCCL-style fields (is_high_priority_stream, ...)."""
        raise NotImplementedError(f"target {self.name} has no options object")

    def effective_config(self, group: dist.ProcessGroup) -> dict[str, Any] | None:
        """The effective communicator config of ``group``, or None when not observable."""
        return None

    def effective_config_for(self, group: dist.ProcessGroup, device_type: str) -> dict[str, Any] | None:
        """The effective config of ``group``'s backend for one device type (multi-device groups)."""
        return None

    def options_fields(self, group: dist.ProcessGroup) -> dict[str, Any]:
        """The NCCL-style fields of ``group``'s own options object (not what reached the communicator)."""
        raise NotImplementedError(f"target {self.name} cannot read a group's options object")

    def mutate_options(self, group: dist.ProcessGroup, **fields: Any) -> None:
        """Change fields of ``group``'s options object in place (to test copy-vs-alias)."""
        raise NotImplementedError(f"target {self.name} cannot change a group's options")

    def probe(self) -> Probe:
        """This rank's probe."""
        return NullProbe()

    def teardown(self) -> None:
        """Undo what init_world and setup did; called after every check."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def environment(self) -> dict[str, Any]:
        """Versions that identify the stack (for the report fingerprint)."""
        return {}
