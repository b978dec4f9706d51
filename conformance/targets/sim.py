"""The simulator target: the embedded reference backend, registered like a vendor's."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

import simulator
from conformance.outcomes import Skipped
from conformance.targets.base import Target, WorldSpec
from conformance.torch_compat import batch_coalesces_python_groups

_CAPS = frozenset({
    "device_binding", "split", "options", "hints", "custom_backend", "torchcomms", "p2p_tags", "p2p_any_source",
    "observe:comms", "observe:launches", "observe:config", "observe:warnings",
})


class SimTarget(Target):
    """Runs checks against the simulator (backend 'sim', device cpu).

    Options: ``path`` ("nccl" or "torchcomms": which integration path the simulator models)
    and ``defects`` (planted defect switches to turn on, for the defect matrix).
    """

    name = "sim"

    def __init__(self, path: str = "nccl", defects: list[str] | tuple[str, ...] | str = ()) -> None:
        if isinstance(defects, str):  # from the CLI: --target-option defects=a,b
            defects = tuple(d for d in defects.split(",") if d)
        if path not in ("nccl", "torchcomms"):
            raise ValueError(f"sim target: path must be 'nccl' or 'torchcomms', got {path!r}")
        for name in defects:
            if name not in simulator.defects.DEFECTS:
                raise ValueError(f"sim target: unknown defect {name!r}; known: {sorted(simulator.defects.DEFECTS)}")
        simulator.faults.check_env()  # a malformed SIM_FAULT is refused here, not in every check
        self.path = path
        self.defects = tuple(defects)

    def unavailable_reason(self) -> str | None:
        return None

    @property
    def capabilities(self) -> frozenset[str]:
        # torch >= 2.14 coalesces batch_isend_irecv for a Python ProcessGroup such as the simulator's
        return _CAPS | {"coalesced_p2p"} if batch_coalesces_python_groups() else _CAPS

    @property
    def default_backend(self) -> str:
        return "cpu:sim"

    def setup(self, rank: int, world_size: int) -> None:
        simulator.LOG.clear()
        self._registered = simulator.register(path=self.path, defects=self.defects)

    def init_world(self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec,
                   timeout_s: float) -> dist.ProcessGroup:
        path = spec.extra.get("path", self.path)
        if path != self._registered.path:  # the path is fixed when the backend is registered
            self._registered = simulator.register(path=path, defects=self.defects)
        world = self._init_default_group(store, rank, world_size, spec, timeout_s)
        if spec.mode == "eager":
            if not isinstance(world, simulator.SimProcessGroup):
                raise Skipped(f"sim target: eager binding needs a simulator world, not {spec.backend!r}")
            simulator.bind_device(world)
        return world

    def make_options(self, **fields: Any) -> simulator.SimOptions:
        return simulator.SimOptions(**fields)

    def effective_config(self, group: dist.ProcessGroup) -> dict[str, Any] | None:
        return group.effective_config() if isinstance(group, simulator.SimProcessGroup) else None

    def options_fields(self, group: dist.ProcessGroup) -> dict[str, Any]:
        return group._get_backend(self.device(0)).options.as_config()

    def mutate_options(self, group: dist.ProcessGroup, **fields: Any) -> None:
        options = group._get_backend(self.device(0)).options
        for key, value in fields.items():
            setattr(options, key, value)

    def probe(self) -> simulator.events.EventLog:
        return simulator.LOG

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            simulator.unregister()
            simulator.faults.clear()

    def environment(self) -> dict[str, Any]:
        return {"backend": "sim", "path": self.path, "defects": list(self.defects)}
