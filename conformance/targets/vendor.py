"""The vendor target: certify an out-of-tree backend that registers with torch.distributed when its module is
imported (``Backend.register_backend``), in every rank process, as ``"<device>:<backend>"``.

Its options, the CPU binding shim, the probe hooks and how a package declares a preset target:
conformance/targets/README.md ("The vendor target"); what each declared capability asks: ``CONTRACT``
(docs/vendor-guide.md). It sees the backend only through torch's front end, the launches probe and the
module's own hooks; declared capabilities are verified, not trusted (a skip among them is a failure).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from conformance.import_probe import imported_from
from conformance.outcomes import NotObservable
from conformance.probe import EVENT_KINDS, Probe
from conformance.targets.base import FEATURES, Driver, Parts, Target, WorldSpec
from conformance.targets.nccl import local_rank
from simulator.shim import cpu_device_types, python_backend_binding, virtual_accelerator, virtual_device

# Declarable: every capability but what the parts and probes decide ("options" is the options part).
DECLARABLE = tuple(sorted(FEATURES | {"options"}))
# What declaring each capability asks of the backend (torch 2.13 / 2.14.1 / 2.15.0 distributed_c10d.py lines;
# docs/vendor-guide.md has the whole contract). Shown by `certify --help` and the guide.
CONTRACT: dict[str, str] = {
    "device_binding": "the group answers _get_backend(device) with an object that has supports_splitting (a bool; "
                      "torch reads it at init and on every new_group of a bound world: 2.13 :2333, :1973; 2.14.1 "
                      ":2635; 2.15.0 :2813) and, when True, eager_connect_single_device(device) (2.13 :2335; 2.14.1 "
                      ":2946; 2.15.0 :3206) and perform_nocolor_split(device) for a non-member of a new_group "
                      "(2.13 :2057; 2.14.1 :2726; 2.15.0 :3021); on cpu the suite binds cpu:0 and calls "
                      "eager_connect_single_device itself",
    "split": "device_binding, plus the group's split_group(ranks, timeout=, opts=, group_name=, group_desc=, "
             "device_types=) returning the child (None on a non-member) whose group_name is the name torch passed "
             "(2.13 :5692, :5720; 2.14.1 :6758, :6786; 2.15.0 :6990, :7018) and which has "
             "_set_sequence_number_for_group() (2.13 :5719)",
    "options": "an options object made by --options-factory (or the module's conformance_make_options) from "
               "NCCL-style fields (is_high_priority_stream, cga_cluster_size, max_ctas, min_ctas, net_name) and "
               "hints=, readable back as "
               "group._get_backend(device).options",
    "hints": "options, plus a hints map (torchcomms CommOptions.hints names) on the options object",
    "multi_device": "one group serving two device types (a device-qualified backend string such as 'cpu:x,cuda:x')",
    "custom_backend": "always declared for a vendor backend: registration through Backend.register_backend",
    "torchcomms": "torch's torchcomms integration path: not something an out-of-tree backend provides",
    "coalesced_p2p": "batch_isend_irecv reaching the backend as one launch (torch 2.14+ coalesces on Python "
                     "backends: _start_coalescing/_end_coalescing on the group)",
    "bitwise_reductions": "ReduceOp BAND, BOR and BXOR of int64 tensors in all_reduce, reduce, reduce_scatter and "
                          "the other reducing collectives, as gloo runs them (undeclared: they may be refused naming "
                          "the op, as ProcessGroupNCCL refuses every bitwise op, getNcclReduceOp)",
    "p2p_tags": "send/recv tags select among messages between the same pair (undeclared: tag matching is not "
                "checked, as NCCL ignores tags)",
    "p2p_any_source": "recv(src=None) receives from whichever peer sends (recv_anysource)",
    "p2p_unordered_receives": "with p2p_tags: irecvs posted at once, each with a tag of its own, complete as their "
                              "own messages arrive, whatever is posted before them, as gloo's do (undeclared: they "
                              "may complete in posting order, as P2P ops on NCCL's stream do)",
    "lazy_pair_comms": "send/recv on a group without a device binding (lazy init) makes one 2-rank communicator "
                       "per unordered pair on first use, as ProcessGroupNCCL does (pytorch PR 129147), and the "
                       "module's conformance_probe() records each as a comm_created event of mode 'p2p' "
                       "(undeclared: a backend that makes none is not judged by the lazy-P2P requirements)",
    "mismatch_detection": "every collective compares what each member called and refuses, on every member, "
                          "different ops, roots, dtypes, sizes, all_to_all split sizes or shapes, and split_group "
                          "split lists that differ, naming the disagreement (neither gloo nor NCCL does)",
    "uneven_all_gather": "all_gather (the list form) of tensors that differ in size across members, every member "
                         "naming the same output sizes, gives each member every tensor exactly (torch documents it, "
                         "2.13 :4196; ProcessGroupNCCL runs it; gloo refuses it naming the size; undeclared: it "
                         "may be refused naming the size or shape)",
}
# Checks that consult a capability beyond the requirements that need it (the spec's capabilities).
CONSULTED: dict[str, str] = {
    "device_binding": "checks that run on the default world run it bound (eager) instead of lazy",
    "split": "COLL-ALLREDUCE-OPS and COLL-GATHER-SCATTER-ORDER also sweep split groups; COLL-MISMATCH-REFUSED "
             "also splits with disagreeing split lists",
    "hints": "HINT-INVALID-REFUSED also refuses invalid hint values",
    "bitwise_reductions": "COLL-ALLREDUCE-OPS and the generated reducing cases of COLL-ROOTED require BAND, BOR "
                          "and BXOR of int64 instead of admitting a refusal naming the op",
    "p2p_tags": "P2P-DATA checks that tags select among messages",
    "p2p_any_source": "P2P-DATA checks recv(src=None)",
    "p2p_unordered_receives": "P2P-DATA (with p2p_tags) checks that the last of 17 posted irecvs completes first "
                              "when its message is sent alone",
    "lazy_pair_comms": "P2P-LAZY-PAIR-COMM and P2P-LAZY-WARN-ONCE fail, instead of not applying, where lazy P2P "
                       "makes no pair communicator",
    "uneven_all_gather": "API-LIST-COLLECTIVES requires the all_gather of uneven tensors instead of admitting a "
                         "refusal naming the size",
}
# NCCL-style fields of an options object, as the options part makes and reads them.
OPTION_FIELDS = ("is_high_priority_stream", "cga_cluster_size", "max_ctas", "min_ctas", "net_name")


def parse_capabilities(value: str | Iterable[str] | None) -> frozenset[str]:
    """Declared capability names from a comma-separated string or a list; unknown names are a ValueError."""
    names = [c.strip() for c in (value.split(",") if isinstance(value, str) else value or ()) if c.strip()]
    unknown = [c for c in names if c not in DECLARABLE]
    if unknown:
        raise ValueError(f"unknown capabilities {unknown}; a backend can declare: {', '.join(DECLARABLE)}")
    return frozenset(names)


def _load_callable(path: str) -> Any:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"expected MODULE:FUNCTION, got {path!r}")
    return getattr(importlib.import_module(module), attr)


@contextlib.contextmanager
def _cpu_split() -> Any:
    """While installed, split_group runs with torch.accelerator reporting cpu (conformance/targets/README.md,
    "The vendor target")."""
    original = dist.split_group

    def split_group(*args: Any, **kwargs: Any) -> Any:
        parent = kwargs.get("parent_pg", args[0] if args else None) or c10d._get_default_group()
        with virtual_accelerator(), cpu_device_types(type(parent)):
            return original(*args, **kwargs)

    dist.split_group = c10d.split_group = split_group
    try:
        yield
    finally:
        dist.split_group = c10d.split_group = original


class VendorOptionsPart:
    """The vendor's options object: made by its factory, read and changed on the group's backend."""

    def __init__(self, target: VendorTarget, factory: str | None) -> None:
        self._target = target
        self._factory = factory

    def make(self, **fields: Any) -> Any:
        """The options object, from ``options_factory`` or the module's ``conformance_make_options``."""
        make = _load_callable(self._factory) if self._factory else self._target.hook("conformance_make_options")
        if make is None:
            raise RuntimeError(
                f"backend {self._target.backend!r} declares capability 'options' but has no options factory (give "
                f"options_factory=MODULE:FUNCTION or module {self._target.module!r}'s conformance_make_options)"
            )
        return make(**fields)

    def _object(self, group: dist.ProcessGroup) -> Any:
        device = group.bound_device_id or self._target.device(0)
        options = getattr(group._get_backend(device), "options", None)
        if options is None:  # the options the group got cannot be read back: not a failure of the backend
            raise NotObservable(f"backend {self._target.backend!r} exposes no options object on its groups")
        return options

    def fields(self, group: dist.ProcessGroup) -> dict[str, Any]:
        """The NCCL-style fields of the options object the group's backend holds."""
        state = self.read(self._object(group))
        return {k: state[k] for k in OPTION_FIELDS}

    def read(self, options: Any) -> dict[str, Any]:
        """The NCCL-style fields of an options object (on it, or on its ``config``), and its ``hints`` map if any."""
        state = {k: getattr(options, k, getattr(getattr(options, "config", None), k, None)) for k in OPTION_FIELDS}
        hints = getattr(options, "hints", None)
        return state | ({"hints": dict(hints)} if isinstance(hints, dict) else {})

    def mutate(self, group: dist.ProcessGroup, **fields: Any) -> None:
        """Set fields on the options object the group's backend holds."""
        self.change(self._object(group), **fields)

    def change(self, options: Any, **fields: Any) -> None:
        """Set fields on the options object, or on its ``config`` where the object itself lacks the field."""
        for key, value in fields.items():
            setattr(options if hasattr(options, key) else options.config, key, value)


class VendorConfigPart:
    """The module's ``conformance_effective_config(group)``."""

    def __init__(self, read: Callable[[dist.ProcessGroup], dict[str, Any] | None]) -> None:
        self._read = read

    def effective(self, group: dist.ProcessGroup, probe: Probe) -> dict[str, Any] | None:
        return self._read(group)

    def for_device(self, group: dist.ProcessGroup, device_type: str) -> dict[str, Any] | None:
        return None  # the hook reports the group's communicator, not one backend per device type


class VendorTarget(Target):
    """An out-of-tree backend, registered by importing the vendor's module in each rank."""

    name = "vendor"
    probes = ("launches",)

    def __init__(self, backend: str, module: str, device: str = "cpu", package: str | None = None,
                 options: bool | str = False, capabilities: str | Iterable[str] | None = None,
                 options_factory: str | None = None) -> None:
        self.backend = backend
        if type(self).name == VendorTarget.name:  # a preset subclass (toyccl's) keeps the name it registered
            self.name = backend  # the report, its file and the checks' messages name the backend certified
        self.module = module
        self.device_type = device
        self.package = package
        declared = set(parse_capabilities(capabilities))
        if options is True or str(options).lower() in ("true", "1", "yes"):
            declared.add("options")
        self._declared = frozenset(declared)
        self.options_factory = options_factory
        self._own_observes: frozenset[str] | None = None

    @property
    def device_types(self) -> tuple[str, ...]:
        return (self.device_type,)

    @property
    def accelerator(self) -> bool:
        """Whether the backend's device is an accelerator (anything but cpu)."""
        return self.device_type != "cpu"

    def import_module(self) -> ModuleType:
        """Import the vendor module; re-run it if the backend is not registered (a check undid it)."""
        mod = importlib.import_module(self.module)
        if not dist.is_backend_available(self.backend):
            mod = importlib.reload(mod)
        if not dist.is_backend_available(self.backend):
            raise RuntimeError(
                f"importing {self.module!r} ({imported_from(mod)}) did not register backend {self.backend!r} "
                "with torch.distributed.Backend.register_backend"
            )
        return mod

    def hook(self, name: str) -> Any:
        """The module's conformance hook ``name``, or None where the module has none."""
        try:
            return getattr(self.import_module(), name, None)
        except Exception:  # noqa: BLE001 - an unimportable module is reported by unavailable_reason
            return None

    def unavailable_reason(self, world_size: int = 1) -> str | None:
        """None when the module imports and registers the backend, and the device is present."""
        try:
            self.import_module()
        except Exception as exc:  # any failure of the vendor's import is the reason  # noqa: BLE001
            return f"vendor module {self.module!r} for backend {self.backend!r}: {type(exc).__name__}: {exc}"
        if self.accelerator:
            device_mod = getattr(torch, self.device_type, None)
            if device_mod is None or not device_mod.is_available():
                return f"no {self.device_type} device visible (torch {torch.__version__} build)"
        return None

    @property
    def declared(self) -> frozenset[str]:
        """What the vendor declared: checks needing these must run, and a skip among them is a failure."""
        return self._declared

    @property
    def features(self) -> frozenset[str]:
        """Declared ones, custom_backend, and device_binding on an accelerator."""
        return frozenset({"custom_backend", *(self._declared - {"options"})}
                         | ({"device_binding"} if self.accelerator else set()))

    @property
    def parts(self) -> Parts:
        """Options where declared; the config part where the module has conformance_effective_config."""
        read = self.hook("conformance_effective_config")
        return Parts(options=VendorOptionsPart(self, self.options_factory) if "options" in self._declared else None,
                     config=VendorConfigPart(read) if read is not None else None)

    @property
    def observes(self) -> frozenset[str]:
        """The outside probes' kinds and warnings, and what the module's ``conformance_probe()`` observes."""
        if self._own_observes is None:
            make = self.hook("conformance_probe")
            self.learn_observes(make() if make is not None else None)
        return super().observes | self._own_observes

    def learn_observes(self, probe: Any) -> None:
        """Keep the event kinds ``probe`` (the module's own, or None) observes, unless known already."""
        if self._own_observes is None:
            self._own_observes = frozenset(probe.observes) & set(EVENT_KINDS) if probe is not None else frozenset()

    @property
    def default_backend(self) -> str:
        """``<device>:<backend>``."""
        return f"{self.device_type}:{self.backend}"

    def device(self, rank: int) -> torch.device:
        """cpu, or ``<device>:<local rank>`` on an accelerator."""
        return torch.device(self.device_type, local_rank(rank)) if self.accelerator else torch.device("cpu")

    def driver(self) -> VendorDriver:
        return VendorDriver(self)

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


class VendorDriver(Driver):
    """Imports the vendor module in the rank; on a binding CPU backend, installs the split shim."""

    target: VendorTarget

    def __init__(self, target: VendorTarget) -> None:
        super().__init__(target)
        self._shim: contextlib.ExitStack | None = None

    def setup(self, rank: int, world_size: int) -> None:
        """Import the vendor module, start the probes, and on a binding CPU backend install the split shim."""
        self.target.import_module()
        super().setup(rank, world_size)
        if not self.target.accelerator and "device_binding" in self.target.declared:
            self._shim = contextlib.ExitStack()
            self._shim.enter_context(_cpu_split())
            self._shim.enter_context(python_backend_binding())

    def own_probe(self) -> Any:
        """The module's ``conformance_probe()`` (a fresh record), or None."""
        make = self.target.hook("conformance_probe")
        probe = make() if make is not None else None
        self.target.learn_observes(probe)  # so that reading target.observes later makes no second probe
        return probe

    def init_world(
        self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec, timeout_s: float
    ) -> dist.ProcessGroup:
        """init_process_group with ``<device>:<backend>``; eager binds the accelerator (or virtual) device."""
        accelerator = self.target.accelerator
        virtual = spec.mode == "eager" and not accelerator  # (an undeclared device_binding: refused at init)
        world = self._init_default_group(store, rank, world_size, spec, timeout_s,
                                         self.device(rank) if spec.mode == "eager" and not virtual else None)
        if virtual:
            device = virtual_device()
            world.bound_device_id = device
            backend = world._get_backend(device) if hasattr(world, "_get_backend") else world
            if hasattr(backend, "eager_connect_single_device"):
                backend.eager_connect_single_device(device)
        return world

    def teardown(self) -> None:
        """Destroy the groups, stop the probes, remove the split shim."""
        try:
            super().teardown()
        finally:
            if self._shim is not None:
                self._shim.close()
            self._shim = None
