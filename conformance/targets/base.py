"""A target in two halves: the description the parent reads, and the driver each rank runs.

Parent side, ``Target``: made from the target's options without changing the process (no probe
started, no world made, no device initialised): whether it can run here, what it can do
(``capabilities``: its ``features``, its ``parts`` and what its probes observe), what it
declares and must prove (``declared``), requirements that do not apply to it, its environment,
its pytest markers, and how to clean up after a killed world (``cleanup``).

Rank side, ``Driver`` (``Target.driver()``, one per rank process and check): set the rank up,
init a world (an eager one only with capability ``device_binding``), the rank's device, the probe, teardown.

An optional ability is a part (``Parts``): a target has it exactly when the part is not None,
and the capability it grants is derived from that, never declared beside it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
import torch.distributed as dist

from conformance.outcomes import Skipped
from conformance.probe import EVENT_KINDS, Probe, observing
from conformance.probes import CombinedProbe, combine, probe_class

if TYPE_CHECKING:
    from conformance.spec import Requirement

# Capabilities a requirement can need. "observe:*" ones are about what can be observed: a target
# without one reports not-observable; without any other one it reports skip.
CAPABILITIES: dict[str, str] = {
    "device_binding": "an eager device binding at init (device_id)",
    "split": "torch.distributed.split_group on a bound parent",
    "options": "process-group options objects carrying NCCL-style fields (the options part)",
    "hints": "a hints map (torchcomms CommOptions.hints names) on the options object",
    "multi_device": "two device types in one process group",
    "custom_backend": "registering an out-of-tree backend in the rank processes",
    "torchcomms": "the torchcomms integration path",
    "coalesced_p2p": "batch_isend_irecv coalesced into one backend launch",
    "bitwise_reductions": "BAND, BOR and BXOR of integer tensors (gloo; NCCL has no bitwise reduction)",
    "p2p_tags": "send/recv tags that select among messages (NCCL ignores tags)",
    "p2p_any_source": "recv(src=None) from whichever peer sends",
    "p2p_unordered_receives": "posted irecvs complete as their own messages arrive, whatever is posted before them "
                              "(NCCL's stream completes P2P ops in posting order)",
    "uneven_all_gather": "all_gather of tensors that differ in size across members (torch documents it; "
                         "ProcessGroupNCCL runs it, gloo refuses it)",
    "lazy_pair_comms": "send/recv on a group without a device binding makes one 2-rank communicator per pair",
    "mismatch_detection": "members that disagree on a collective (op, root, dtype, size, split sizes, shapes, "
                          "split lists) are refused on every member, naming the disagreement",
    **{observing(kind): f"the probe's {kind} events (conformance.probe)" for kind in EVENT_KINDS},
    "observe:config": "the effective config of a communicator (the config part)",
}
# Capabilities a target may name among its features (the rest come from its parts and its probe).
FEATURES = frozenset(c for c in CAPABILITIES if not c.startswith("observe:") and c != "options")


@dataclass
class WorldSpec:
    """How a check wants its world: eager (device-bound) or lazy, backend string, options."""

    mode: str = "eager"
    backend: str | None = None
    pg_options: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class OptionsPart(Protocol):
    """The backend's options object (capability ``options``)."""

    def make(self, **fields: Any) -> Any:
        """An options object from NCCL-style fields (is_high_priority_stream, max_ctas, ...) and ``hints``."""

    def fields(self, group: dist.ProcessGroup) -> dict[str, Any]:
        """The NCCL-style fields of ``group``'s own options object (not what reached the communicator)."""

    def read(self, options: Any) -> dict[str, Any]:
        """What an options object ``make`` returned holds now: its NCCL-style fields, and ``hints`` where it has a
        hints map (a caller's object, to see that making a group left it as the caller set it)."""

    def change(self, options: Any, **fields: Any) -> None:
        """Set NCCL-style fields on an options object ``make`` returned (a caller reusing its object)."""

    def mutate(self, group: dist.ProcessGroup, **fields: Any) -> None:
        """Change fields of ``group``'s options object in place (to test copy-vs-alias)."""


class ConfigPart(Protocol):
    """The effective config a communicator got (capability ``observe:config``).

    Both methods answer None when this group (or device type) shows no communicator config.
    """

    def effective(self, group: dist.ProcessGroup, probe: Probe) -> dict[str, Any] | None:
        """The effective communicator config of ``group``."""

    def for_device(self, group: dist.ProcessGroup, device_type: str) -> dict[str, Any] | None:
        """The config of ``group``'s backend for one device type (multi-device groups)."""


@dataclass(frozen=True)
class Parts:
    """A target's optional abilities: a part that is None is an ability the target lacks."""

    options: OptionsPart | None = None
    config: ConfigPart | None = None


@dataclass(frozen=True)
class Traits:
    """How a stack words and scopes what checks look for; the defaults suit a quiet CPU stack."""

    # Words a refusal of a kind may use instead of the check's generic ones (checks.common.refusal_words).
    refusal_words: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # What the lazy-P2P warning says (None: the check's generic words), and whether it comes once per
    # "group" or once per "process"; whether it reaches stderr rather than Python's warnings.
    lazy_p2p_warning: tuple[str, ...] | None = None
    lazy_p2p_warning_scope: str = "group"
    warnings_on_stderr: bool = False
    # Where wait() only orders device streams: how long P2P-MISMATCH waits on a receive (None: plain wait()).
    p2p_wait_timeout_s: float | None = None
    # Whether a send may stay outstanding while its receiver first runs collectives of the same group (False
    # where a send blocks the device queue it shares with the group's collectives until its receive is posted).
    sends_pass_collectives: bool = True
    # Whether a Work's future is completed when the op is enqueued, with its outputs, whatever the op's fate
    # (ProcessGroupNCCL marks it so at launch): a failed op's future then says nothing, and is not judged.
    future_done_at_launch: bool = False
    # Whether a wait(timeout) that elapses aborts the group's communicator (ProcessGroupNCCL's wait with a
    # timeout does): the late peers' ops then never complete, so no check lets a timed wait elapse there.
    timed_wait_aborts: bool = False


class Target(abc.ABC):
    """Parent side of one stack: built from its options, never changes the process it runs in."""

    # The report's and the messages' name (a vendor target takes its backend's, per instance).
    name: str = ""
    gpu: ClassVar[bool] = False
    # The outside probes (names in conformance.probes.PROBES) the driver starts on every rank.
    probes: ClassVar[tuple[str, ...]] = ()
    traits: ClassVar[Traits] = Traits()
    # Checks that must get rank processes of their own (conformance.runner.orchestrate.run_case), by id and
    # by a capability their requirement needs.
    fresh_process_checks: ClassVar[frozenset[str]] = frozenset()
    fresh_process_capabilities: ClassVar[frozenset[str]] = frozenset()

    def isolates(self, requirement: Requirement) -> bool:
        """Whether ``requirement``'s check gets rank processes of its own rather than the pool's."""
        return (requirement.id in self.fresh_process_checks
                or not self.fresh_process_capabilities.isdisjoint(requirement.capabilities))

    # What a subclass may state as a class attribute or derive from its options as a property:
    @property
    def features(self) -> frozenset[str]:
        """Non-observation capabilities the stack has (names from FEATURES)."""
        return frozenset()

    @property
    def parts(self) -> Parts:
        """The optional abilities present (a part that is None is absent)."""
        return Parts()

    @property
    def stack(self) -> str | None:
        """The NCCL stack the target runs (simulator.stacks.STACKS names them), where it runs one: requirements
        the spec skips on that stack (``skip_stacks``) skip here, naming it."""
        return None

    @abc.abstractmethod
    def unavailable_reason(self, world_size: int = 1) -> str | None:
        """None when this target can run a world of ``world_size`` here, else one line saying why not."""

    @abc.abstractmethod
    def driver(self) -> Driver:
        """The rank-side driver (made in a rank process, once per check)."""

    @property
    def observes(self) -> frozenset[str]:
        """Event kinds the driver's probe records: its outside probes' (see conformance.probes), and
        warnings, which a check records itself (Python warnings, or stderr per ``traits``)."""
        return frozenset({"warning"}).union(*(probe_class(p).observes for p in self.probes))

    @property
    def declared(self) -> frozenset[str]:
        """Capabilities declared rather than built in: verified, not trusted (a skip among them fails)."""
        return frozenset()

    @property
    def capabilities(self) -> frozenset[str]:
        """The features, one per present part, and ``observe:<kind>`` per kind the probe records."""
        parts = {"options"} if self.parts.options is not None else set()
        if self.parts.config is not None:
            parts.add("observe:config")
        return frozenset(self.features | parts | {observing(k) for k in self.observes})

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

    def environment(self) -> dict[str, Any]:
        """Versions that identify the stack (for the report fingerprint)."""
        return {}

    def cleanup(self, scratch: str) -> None:  # noqa: B027 - optional hook
        """Remove what killed rank processes of this target left outside themselves.

        ``scratch`` is the name prefix the runner gave those processes (conformance.runner.worker.
        ``SCRATCH_ENV``); called by the runner after it killed them. Default: nothing to remove.
        """


class Driver:
    """Rank side of a target: one per rank process and check (this one: a plain world, no device given)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._probe: CombinedProbe | None = None
        self._outside: list[Any] = []

    # What checks read of the description, for brevity (``ctx.target.name``, ...).
    @property
    def name(self) -> str:
        return self.target.name

    @property
    def capabilities(self) -> frozenset[str]:
        return self.target.capabilities

    @property
    def parts(self) -> Parts:
        return self.target.parts

    @property
    def traits(self) -> Traits:
        return self.target.traits

    @property
    def default_backend(self) -> str:
        return self.target.default_backend

    @property
    def device_types(self) -> tuple[str, ...]:
        return self.target.device_types

    def device(self, rank: int) -> torch.device:
        """The device this rank's tensors live on."""
        return self.target.device(rank)

    def setup(self, rank: int, world_size: int) -> None:
        """Prepare the rank process before a check and start the probe."""
        self.probe()

    def own_probe(self) -> Any:
        """The backend's own probe, which wins the event kinds it shares with the outside probes (default none)."""
        return None

    def probe(self) -> CombinedProbe:
        """This rank's probe: the backend's own, then the target's outside probes, started once per check."""
        if self._probe is None:
            self._outside = [probe_class(p)().start() for p in self.target.probes]
            self._probe = combine(self.own_probe(), *self._outside)
        return self._probe

    def init_world(
        self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec, timeout_s: float
    ) -> dist.ProcessGroup:
        """Initialise the default process group as ``spec`` asks and return it (default: no device given)."""
        return self._init_default_group(store, rank, world_size, spec, timeout_s)

    def _init_default_group(self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec,
                            timeout_s: float, device_id: torch.device | None = None) -> dist.ProcessGroup:
        """init_process_group with the spec's backend (or the target's default) and options, the store
        passed through the probes that read it, and the world shown to the probes that watch it."""
        if spec.mode not in ("eager", "lazy"):
            raise ValueError(f"unknown world mode {spec.mode!r}; expected 'eager' or 'lazy'")
        if spec.mode == "eager" and "device_binding" not in self.capabilities:
            raise Skipped(f"target {self.name} lacks capability 'device_binding': an eager world binds a device at "
                          "init")
        self.probe()
        for outside in self._outside:
            store = outside.attach_store(store)
        dist.init_process_group(
            backend=spec.backend or self.default_backend, store=store, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s), pg_options=spec.pg_options, device_id=device_id,
        )
        world = dist.group.WORLD
        for outside in self._outside:
            outside.world_created(world)
        return world

    def teardown(self) -> None:
        """Destroy the groups and stop the probe; called after every check."""
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            if self._probe is not None:
                self._probe.close()
            self._probe, self._outside = None, []
