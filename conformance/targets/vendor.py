"""The vendor target: certify an out-of-tree backend that registers with torch.distributed.

A vendor's package registers its backend when a module is imported, through
``torch.distributed.Backend.register_backend(name, creator, extended_api=..., devices=[...])``.
This target imports that module in every rank process and inits worlds with
``"<device>:<backend>"``. Options: ``backend`` (the registered name), ``device`` ("cpu" or an
accelerator type such as "cuda", "xpu"), ``module`` (what to import), ``package`` (the
distribution name, for the report), ``options`` (True if the backend honours NCCL-style
process-group options; the module must then expose ``conformance_make_options(**fields)``).

On ``cpu`` there is no device binding, so eager worlds are skipped (capability
``device_binding``); on an accelerator, eager passes ``device_id=<device>:<LOCAL_RANK>``.

What the suite can observe: nothing (a NullProbe), unless the module exposes
``conformance_probe()`` returning an object with the conformance.probe.Probe protocol
(``observes``, ``events(kind, since)``, ``mark()``); its ``observes`` kinds become the
target's ``observe:*`` capabilities.

Declaring a target from the vendor's package: add an entry point in the group
``conformance.targets`` whose value is a Target subclass, typically a VendorTarget with
preset options, e.g. in pyproject.toml::

    [project.entry-points."conformance.targets"]
    toyccl = "toyccl.conformance:ToycclTarget"

Then ``conformance`` lists it among the targets and runs it by that name, no options needed
(examples/toyccl does exactly this).
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from conformance.outcomes import Skipped
from conformance.probe import NullProbe, Probe
from conformance.targets.base import Target, WorldSpec
from conformance.targets.nccl import local_rank

_OBSERVE = {
    "comm_created": "observe:comms",
    "launch": "observe:launches",
    "config_applied": "observe:config",
    "warning": "observe:warnings",
}


class VendorTarget(Target):
    """An out-of-tree backend, registered by importing the vendor's module in each rank."""

    name = "vendor"

    def __init__(self, backend: str, module: str, device: str = "cpu", package: str | None = None,
                 options: bool = False) -> None:
        self.backend = backend
        self.module = module
        self.device_type = device
        self.package = package
        self.declares_options = options
        self._probe: Probe | None = None

    @property
    def device_types(self) -> tuple[str, ...]:
        return (self.device_type,)

    @property
    def accelerator(self) -> bool:
        """Whether the backend's device is an accelerator (anything but cpu)."""
        return self.device_type != "cpu"

    def _import(self) -> ModuleType:
        """Import the vendor module; re-run it if the backend is not registered (a check undid it)."""
        mod = importlib.import_module(self.module)
        if not dist.is_backend_available(self.backend):
            mod = importlib.reload(mod)
        if not dist.is_backend_available(self.backend):
            raise RuntimeError(
                f"importing {self.module!r} did not register backend {self.backend!r} "
                "with torch.distributed.Backend.register_backend"
            )
        return mod

    def unavailable_reason(self) -> str | None:
        """None when the module imports and registers the backend, and the device is present."""
        try:
            self._import()
        except Exception as exc:  # any failure of the vendor's import is the reason  # noqa: BLE001
            return f"vendor module {self.module!r} for backend {self.backend!r}: {type(exc).__name__}: {exc}"
        if self.accelerator:
            device_mod = getattr(torch, self.device_type, None)
            if device_mod is None or not device_mod.is_available():
                return f"no {self.device_type} device visible (torch {torch.__version__} build)"
        return None

    @property
    def capabilities(self) -> frozenset[str]:
        """custom_backend; options if declared; device_binding on an accelerator; the probe's kinds."""
        caps = {"custom_backend"}
        if self.declares_options:
            caps.add("options")
        if self.accelerator:
            caps.add("device_binding")
        observes = self.probe().observes if self.module in sys.modules else frozenset()
        caps.update(_OBSERVE[k] for k in observes if k in _OBSERVE)
        return frozenset(caps)

    @property
    def default_backend(self) -> str:
        """``<device>:<backend>``."""
        return f"{self.device_type}:{self.backend}"

    def device(self, rank: int) -> torch.device:
        """cpu, or ``<device>:<local rank>`` on an accelerator."""
        return torch.device(self.device_type, local_rank(rank)) if self.accelerator else torch.device("cpu")

    def setup(self, rank: int, world_size: int) -> None:
        """Import the vendor module so that its backend is registered in this rank process."""
        self._import()

    def init_world(
        self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec, timeout_s: float
    ) -> dist.ProcessGroup:
        """init_process_group with ``<device>:<backend>``; eager binds the accelerator device."""
        if spec.mode == "eager" and not self.accelerator:
            raise Skipped(
                f"backend {self.backend!r} runs on cpu: an eager world needs capability device_binding"
            )
        return self._init_default_group(store, rank, world_size, spec, timeout_s,
                                        self.device(rank) if spec.mode == "eager" else None)

    def make_options(self, **fields: Any) -> Any:
        """The vendor's options object, from its module's ``conformance_make_options(**fields)``."""
        make = getattr(self._import(), "conformance_make_options", None) if self.declares_options else None
        if make is None:
            raise NotImplementedError(
                f"backend {self.backend!r} declares no options object "
                f"(module {self.module!r} needs conformance_make_options and the target options=True)"
            )
        return make(**fields)

    def probe(self) -> Probe:
        """The vendor module's ``conformance_probe()``, else a NullProbe."""
        if self._probe is None:
            make = getattr(sys.modules.get(self.module), "conformance_probe", None)
            self._probe = make() if make is not None else NullProbe()
        return self._probe

    def environment(self) -> dict[str, Any]:
        """Backend name, its distribution and version, and torch's version."""
        top = self.module.split(".")[0]
        package = self.package or next(iter(packages_distributions().get(top, [])), None)
        try:
            pkg_version = version(package) if package else None
        except PackageNotFoundError:
            pkg_version = None
        return {"backend": self.backend, "package": package, "version": pkg_version,
                "device": self.device_type, "torch": torch.__version__}
