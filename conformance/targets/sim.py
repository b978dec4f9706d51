"""The simulator target: the embedded reference backend, registered like a vendor's."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

import simulator
from conformance.outcomes import Skipped
from conformance.probe import EVENT_KINDS, Probe
from conformance.runner.worker import SCRATCH_ENV
from conformance.targets.base import Driver, Parts, Target, WorldSpec
from conformance.torch_compat import batch_coalesces_python_groups, default_stack
from simulator import shm
from simulator.comm import SHM_PREFIX_ENV

_FEATURES = frozenset({
    "device_binding", "split", "hints", "custom_backend", "torchcomms", "p2p_tags", "p2p_any_source",
    "mismatch_detection", "lazy_pair_comms", "uneven_all_gather",
})


class SimOptionsPart:
    """The simulator's SimOptions, on the group's cpu backend."""

    def make(self, **fields: Any) -> simulator.SimOptions:
        return simulator.SimOptions(**fields)

    def fields(self, group: dist.ProcessGroup) -> dict[str, Any]:
        return self.read(group._get_backend(torch.device("cpu")).options)

    def read(self, options: simulator.SimOptions) -> dict[str, Any]:
        return options.as_config()

    def change(self, options: simulator.SimOptions, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(options, key, value)

    def mutate(self, group: dist.ProcessGroup, **fields: Any) -> None:
        self.change(group._get_backend(torch.device("cpu")).options, **fields)


class SimConfigPart:
    """The config each simulator communicator records it was given."""

    def effective(self, group: dist.ProcessGroup, probe: Probe) -> dict[str, Any] | None:
        return group.effective_config() if isinstance(group, simulator.SimProcessGroup) else None

    def for_device(self, group: dist.ProcessGroup, device_type: str) -> dict[str, Any] | None:
        return None  # one device type only: the simulator serves cpu


class SimTarget(Target):
    """Runs checks against the simulator (backend 'sim', device cpu).

    Options: ``stack`` (a name in ``simulator.stacks.STACKS``: which NCCL stack the simulator models; default
    what the running torch's ``nccl`` means, ``torch_compat.default_stack``),
    ``defects`` (planted defects to compose in, for the defect matrix) and ``record_consulted`` (each rank's
    driver keeps in ``consulted`` the planted defects its backend could have met, for the matrix's plan).
    """

    name = "sim"
    parts = Parts(options=SimOptionsPart(), config=SimConfigPart())
    stack: str = ""  # the stack chosen (set per instance from the options)
    default_backend = "cpu:sim"

    def __init__(self, stack: str = "", defects: list[str] | tuple[str, ...] | str = (),
                 record_consulted: bool | str = False) -> None:
        if isinstance(defects, str):  # from the CLI: --target-option defects=a,b
            defects = tuple(d for d in defects.split(",") if d)
        stack = stack or default_stack()
        if stack not in simulator.stacks.STACKS:
            raise ValueError(f"sim target: stack must be one of {', '.join(simulator.stacks.STACKS)}, got {stack!r}")
        try:
            simulator.defects.planted(defects, environ={})
        except ValueError as exc:
            raise ValueError(f"sim target: {exc}") from None
        simulator.faults.check_env()  # a malformed SIM_FAULT is refused here, not in every check
        self.stack = stack
        self.defects = tuple(defects)
        self.record_consulted = record_consulted not in (False, "", "0", "false")

    def unavailable_reason(self, world_size: int = 1) -> str | None:
        return None

    @property
    def features(self) -> frozenset[str]:
        # torch >= 2.14 coalesces batch_isend_irecv for a Python ProcessGroup such as the simulator's
        features = _FEATURES | {"coalesced_p2p"} if batch_coalesces_python_groups() else _FEATURES
        # nccl-lazy sends on per-pair communicators: nothing receives from any source (simulator/stacks.py)
        return features - {"p2p_any_source"} if self.stack == "nccl-lazy" else features

    @property
    def observes(self) -> frozenset[str]:
        """Every kind: the simulator records its own events (simulator.LOG)."""
        return frozenset(EVENT_KINDS)

    def driver(self) -> SimDriver:
        return SimDriver(self)

    def environment(self) -> dict[str, Any]:
        return {"backend": "sim", "stack": self.stack, "defects": list(self.defects)}

    def cleanup(self, scratch: str) -> None:
        """Remove the shared-memory segments killed ranks left (the simulator names them with ``scratch``)."""
        shm.sweep(scratch)


class SimDriver(Driver):
    """Registers the simulator in the rank, with the target's stack and defects."""

    target: SimTarget

    def setup(self, rank: int, world_size: int) -> None:
        simulator.LOG.clear()
        scratch = os.environ.get(SCRATCH_ENV)
        if scratch:  # the runner's name for what this rank leaves outside itself, which cleanup() removes
            os.environ[SHM_PREFIX_ENV] = scratch
        self.consulted: set[str] | None = set() if self.target.record_consulted else None
        self._registered = simulator.register(stack=self.target.stack, defects=self.target.defects,
                                              consulted=self.consulted)
        super().setup(rank, world_size)

    def own_probe(self) -> simulator.events.EventLog:
        return simulator.LOG

    def init_world(self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec,
                   timeout_s: float) -> dist.ProcessGroup:
        # a check that needs the torchcomms routing asks for it (init_world(path="torchcomms"))
        stack = "torchcomms" if spec.extra.get("path") == "torchcomms" else self.target.stack
        if stack != self._registered.stack:  # the stack is fixed when the backend is registered
            self._registered = simulator.register(stack=stack, defects=self.target.defects, consulted=self.consulted)
        world = self._init_default_group(store, rank, world_size, spec, timeout_s)
        if spec.mode == "eager":
            if not isinstance(world, simulator.SimProcessGroup):
                raise Skipped(f"sim target: eager binding needs a simulator world, not {spec.backend!r}")
            simulator.bind_device(world)
        return world

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            simulator.unregister()
            simulator.faults.clear()
