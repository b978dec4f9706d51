"""The NCCL target: real torch.distributed with ProcessGroupNCCL (ProcessGroupNCCL2 where torch 2.15 builds it
for "nccl") on CUDA devices, one per rank; ``NcclProbe`` reads NCCL's debug log and torch's flight recorder.

conformance/targets/README.md ("The NCCL target") says what each source shows, with the upstream lines. It
cannot see communicators created before setup() or destroyed, NCCL's own warnings, ops issued outside torch,
nor, on ProcessGroupNCCL2, launches.
"""

from __future__ import annotations

import itertools
import os
import socket
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conformance.gpu.devices import NvmlUnavailable, device_names, driver_version, visible_devices
from conformance.gpu.flight_recorder import launch_events, load_dump
from conformance.gpu.nccl_log import expand_debug_file, parse_nccl_log_file
from conformance.probe import Event, Probe
from conformance.targets.base import Driver, Parts, Target, Traits, WorldSpec
from conformance.torch_compat import default_stack

_OPTION_FIELDS = ("cga_cluster_size", "max_ctas", "min_ctas", "net_name")
_NCCL_CONFIG_UNDEF_INT = -(2**31)  # NCCL_CONFIG_UNDEF_INT: a config field left unset
FR_BUFFER_SIZE = "2000"
NCCL2_PROBE_NOTE = (
    "ProcessGroupNCCL2: communicators from NCCL's log, named through _comm_ptr; launches not observed: its ops "
    "are recorded per dispatcher op by c10d's FlightRecorderHook into the 'nccl2' recorder, with no entry for "
    "a coalescing block, so a block of N ops would read as N launches")
PAIR_WAIT_S = 5.0  # how long a rank waits for the other member of a pair comm to publish itself
_claims = itertools.count()  # numbers this process's claims of pair-comm slots (NcclProbe._publish)


def local_rank(rank: int) -> int:
    """The rank's device index: LOCAL_RANK (torchrun) if set, else the global rank."""
    return int(os.environ.get("LOCAL_RANK", rank))


def _dump_fn() -> Any:
    c10d = torch._C._distributed_c10d
    return getattr(c10d, "_dump_nccl_trace", None) or getattr(c10d, "_dump_fr_trace", None)


def nccl_is_torchcomms_engine() -> bool:
    """Whether "nccl" builds ProcessGroupNCCL2 (torch 2.15: the torchcomms engine, unless
    TORCH_DIST_USE_NCCL2=0; distributed_c10d.py:961-985) rather than ProcessGroupNCCL."""
    c10d = dist.distributed_c10d
    return hasattr(c10d, "_create_nccl2_process_group") and os.environ.get("TORCH_DIST_USE_NCCL2") != "0"


def flight_recorder_usable() -> bool:
    """Whether this torch build can dump the flight recorder."""
    return _dump_fn() is not None


def _dump() -> dict[str, Any]:
    fn = _dump_fn()
    return load_dump(fn(includeCollectives=True, includeStackTraces=False, onlyActive=False))


def _debug_file(rank: int) -> Path:
    return Path(tempfile.gettempdir()) / "conformance-nccl" / f"rank{rank}-pid{os.getpid()}.log"


def _comm_groups() -> dict[str, tuple[str, list[int]]]:
    """Live process groups by their default CUDA communicator pointer (lower-case hex)."""
    found: dict[str, tuple[str, list[int]]] = {}
    if not dist.is_initialized():
        return found
    for group, name in list(dist.distributed_c10d._world.pg_names.items()):
        try:
            ptr = group._get_backend(torch.device("cuda"))._comm_ptr()
            found[hex(int(ptr))] = (name, sorted(dist.get_process_group_ranks(group)))
        except Exception:  # no CUDA backend, comm not initialised yet, or no _comm_ptr  # noqa: BLE001
            continue
    return found


class NcclProbe:
    """Comm creation from the rank's NCCL log, launches from the flight recorder (see module doc).

    ``dump`` returns the flight recorder's dump (None: launches are not observed) and ``groups`` the live
    process groups by communicator pointer; the driver passes this process's own (``_dump``,
    ``_comm_groups``), a test a recorded run's.
    """

    def __init__(self, log_path: Path, dump: Callable[[], dict[str, Any]] | None = None,
                 groups: Callable[[], dict[str, tuple[str, list[int]]]] | None = None,
                 destroys: bool = False) -> None:
        self.observes = frozenset({"comm_created", *(["launch"] if dump is not None else []),
                                   *(["comm_destroyed"] if destroys else [])})
        self._log_path = log_path
        self._log_offset = log_path.stat().st_size if log_path.exists() else 0
        self._dump = dump
        self._groups = groups or _comm_groups
        self._last_record = self._latest_record() if dump is not None else -1
        self._comms_seen = 0
        self._events: list[Event] = []
        self._store: dist.Store | None = None
        self._rank = -1
        self._unresolved: list[tuple[Event, int]] = []

    def _latest_record(self) -> int:
        assert self._dump is not None
        ids = [e.get("record_id", -1) for e in self._dump().get("entries", [])]
        return max([i for i in ids if isinstance(i, int)], default=-1)

    def world_initialised(self, store: dist.Store, rank: int) -> None:
        """Called once init_process_group returned: communicators logged so far were made eagerly.

        ``store`` (the run's own store) is where this rank publishes the pair communicators it
        joins, so that both members can tell who the other is (see ``_resolve``).
        """
        self._store, self._rank = store, rank
        self._refresh(during_init=True)

    def _mode(self, event: Event, during_init: bool) -> str | None:
        """eager: made while the world initialised; lazy: a live group's comm made later; p2p: a
        2-rank comm no group owns, made later (ProcessGroupNCCL's per-pair comm under lazy init)."""
        if event["parent"]:
            return "split"
        if during_init:
            return "eager"
        if event["group"] is not None:
            return "lazy"
        if self._store is not None and event["nranks"] == 2 and event.get("comm_hash"):
            return "p2p"
        return None

    def _publish(self, event: Event) -> None:
        """Claim this rank's slot (its rank in the comm) under the comm's commId in the store.

        A commId can come back: a communicator made after one was destroyed may reuse it (e07 in
        tests/gpu/samples/real: rank 1's re-init logs commId 0x56bea185a98d5193 again). So the slots of
        one commId come in generations: a member claims its slot in the first generation where that slot
        is free, and the k-th comm to use the commId fills generation k, whatever else each member saw.
        """
        assert self._store is not None
        mine = f"{self._rank} {os.getpid()} {next(_claims)}"  # unique to this claim: a rank may claim again
        generation = 1
        while self._store.compare_set(self._slot(event, generation, event["rank"]), "", mine).decode() != mine:
            generation += 1
        self._unresolved.append((event, generation))

    @staticmethod
    def _slot(event: Event, generation: int, rank_in_comm: int) -> str:
        return f"nccl-probe/{event['comm_hash']}/{generation}/{rank_in_comm}"

    def _resolve(self) -> None:
        """Fill ``members`` of pair comms from the slots every member claimed (NCCL logs only the rank in
        the comm and the commId, which is the same on every member)."""
        assert self._store is not None
        waiting = []
        for event, generation in self._unresolved:
            slots = [self._slot(event, generation, i) for i in range(event["nranks"])]
            try:
                self._store.wait(slots, timedelta(seconds=PAIR_WAIT_S))
            except Exception:  # the peer has not looked at its log yet: try again on the next read  # noqa: BLE001
                waiting.append((event, generation))
                continue
            event["members"] = sorted(int(self._store.get(k).split()[0]) for k in slots)
        self._unresolved = waiting

    def _refresh(self, during_init: bool = False) -> None:
        logged = parse_nccl_log_file(self._log_path, self._log_offset)
        owners = self._groups() if any(e["kind"] == "comm_created" for e in logged[self._comms_seen:]) else {}
        for event in logged[self._comms_seen:]:
            if event["kind"] == "comm_destroyed":
                self._events.append(event)
                continue
            if event["comm"] in owners:
                event["group"], event["members"] = owners[event["comm"]]
            event["mode"] = self._mode(event, during_init)
            if event["mode"] == "p2p":
                self._publish(event)
            self._events.append(event)
        self._comms_seen = len(logged)
        if self._unresolved:
            self._resolve()
        if self._dump is not None:
            launches = launch_events(self._dump(), self._last_record)
            self._events.extend(launches)
            if launches:
                self._last_record = max(e["record_id"] for e in launches)

    def events(self, kind: str | None = None, since: int = 0) -> list[Event]:
        """Events recorded since setup (of one kind, from index ``since``)."""
        self._refresh()
        return [e for e in self._events[since:] if kind is None or e["kind"] == kind]

    def mark(self) -> int:
        """An index to pass as ``since`` to see only later events."""
        self._refresh()
        return len(self._events)


class NcclOptionsPart:
    """ProcessGroupNCCL.Options: is_high_priority_stream and the NCCL config fields."""

    def make(self, **fields: Any) -> Any:
        """A ProcessGroupNCCL.Options with is_high_priority_stream and NCCL config fields set."""
        opts = dist.ProcessGroupNCCL.Options()
        for key, value in fields.items():
            if key == "is_high_priority_stream":
                opts.is_high_priority_stream = value
            elif key in _OPTION_FIELDS:
                setattr(opts.config, key, value)
            else:
                raise ValueError(
                    f"ProcessGroupNCCL.Options has no field {key!r}; known: is_high_priority_stream, "
                    + ", ".join(_OPTION_FIELDS)
                )
        return opts

    def fields(self, group: dist.ProcessGroup) -> dict[str, Any]:
        """The fields of the group's ProcessGroupNCCL.Options object; NCCL's 'unset' marker reads as None."""
        return self.read(group._get_backend(torch.device("cuda")).options)

    def read(self, opts: Any) -> dict[str, Any]:
        """The fields of a ProcessGroupNCCL.Options object; NCCL's 'unset' marker reads as None."""
        config: dict[str, Any] = {"is_high_priority_stream": opts.is_high_priority_stream}
        for key in _OPTION_FIELDS:
            value = getattr(opts.config, key, None)
            config[key] = None if value == _NCCL_CONFIG_UNDEF_INT else value
        return config

    def change(self, options: Any, **fields: Any) -> None:
        """Set fields of a ProcessGroupNCCL.Options: is_high_priority_stream on it, the rest on its config."""
        for key, value in fields.items():
            setattr(options if key == "is_high_priority_stream" else options.config, key, value)

    def mutate(self, group: dist.ProcessGroup, **fields: Any) -> None:
        """Change fields of the group's ProcessGroupNCCL.Options in place."""
        self.change(group._get_backend(torch.device("cuda")).options, **fields)


class NcclConfigPart:
    """What the NCCL log shows of a communicator's config (see NcclProbe)."""

    def effective(self, group: dist.ProcessGroup, probe: Probe) -> dict[str, Any] | None:
        """What the group's NCCL communicator logged of its config (NCCL logs only the fields a caller
        set), or None when the log shows no communicator for the group. is_high_priority_stream is a
        property of torch's streams, not of the communicator: it is read from the backend's options."""
        logged = [e for e in probe.events("comm_created") if e.get("group") == group.group_name]
        if not logged:
            return None
        config = {key: (logged[-1].get("config") or {}).get(key) for key in _OPTION_FIELDS}
        config["is_high_priority_stream"] = NcclOptionsPart().fields(group)["is_high_priority_stream"]
        return config

    def for_device(self, group: dist.ProcessGroup, device_type: str) -> dict[str, Any] | None:
        """The public option fields of the group's backend for ``device_type`` (e.g. gloo's on cpu)."""
        if device_type == "cuda":
            return NcclOptionsPart().fields(group)
        opts = group._get_backend(torch.device(device_type)).options
        fields = {k: getattr(opts, k) for k in dir(opts) if not k.startswith("_") and not callable(getattr(opts, k))}
        config = getattr(opts, "config", None)
        if config is not None:
            fields.update({k: getattr(config, k, None) for k in _OPTION_FIELDS})
        return fields


class NcclTarget(Target):
    """torch.distributed with ProcessGroupNCCL, one CUDA device per rank."""

    name = "nccl"
    gpu = True
    features = frozenset({"device_binding", "split", "multi_device", "coalesced_p2p"})
    parts = Parts(options=NcclOptionsPart(), config=NcclConfigPart())
    device_types = ("cuda",)
    default_backend = "cpu:gloo,cuda:nccl"
    # Whether this target's ops land in c10d's flight recorder (what _dump_nccl_trace reads).
    c10d_records_launches = True
    # Checks that get rank processes of their own (conformance.runner.orchestrate.run_case):
    # ProcessGroupNCCL's lazy-P2P warning is a TORCH_WARN_ONCE, printed once per process (see
    # traits.lazy_p2p_warning), and a size-mismatched send/recv can leave a kernel spinning on the device
    # after wait() returned (wait() only orders streams), which would poison later checks; so can a collective
    # whose peer never joined (COLL-BAD-ARGS-REFUSED's one-rank cases, COLL-ABSENT-PEER).
    fresh_process_checks = frozenset({"P2P-LAZY-WARN-ONCE", "P2P-MISMATCH", "COLL-BAD-ARGS-REFUSED",
                                      "COLL-ABSENT-PEER", "API-LIFECYCLE"})
    # torch 2.11.0 with NCCL 2.28.9 (H200, world size 1) segfaults in split_group (distributed_c10d.py:5323,
    # the C++ split) once the process has destroyed a world and initialised another: a check that splits must
    # not inherit a pooled process's earlier worlds, or the crash is charged to it. API-LIFECYCLE meets that
    # on purpose, in a process of its own whose first world is its own.
    fresh_process_capabilities = frozenset({"split"})
    traits = Traits(
        # ncclSend "is blocking for the GPU" (NCCL v2.30.7 src/nccl.h.in:585, docs/userguide/source/api/p2p.rst:23),
        # and under eager init a group's sends run on its collectives' communicator (P2P-EAGER-REUSE): a send
        # whose receiver runs collectives of that group before receiving waits for a receive queued behind them.
        sends_pass_collectives=False,
        # ProcessGroupNCCL's lazy-P2P warning: "... An unbatched P2P op (send/recv) was called on this
        # ProcessGroup with size N.  In lazy initialization mode, this will result in a new 2-rank NCCL
        # communicator to be created." (in torch 2.15.0's libtorch_cuda.so; a TORCH_WARN_ONCE, hence the
        # "(function operator())" c10 prints after it). c10's default warning handler writes it to the
        # process's stderr, not to Python's warnings: the check reads fd 2.
        lazy_p2p_warning=("lazy initialization mode", "2-rank"),
        warnings_on_stderr=True,
        lazy_p2p_warning_scope="process",  # a TORCH_WARN_ONCE: once per process, whatever the group
        # WorkNCCL.wait() only makes the current stream wait; given a timeout it blocks the host until the
        # work completes and raises when it has not ("... milliseconds before timing out", torch 2.15.0
        # libtorch_cuda.so). P2P-MISMATCH waits with this timeout so a receive that never completes is seen.
        p2p_wait_timeout_s=10.0,
        # ProcessGroupNCCL::collective and ::pointToPoint mark the Work's future completed with its outputs at
        # launch (work->future_->markCompleted(at::IValue(*work->outputs_))), and WorkNCCL::wait given a timeout
        # aborts the communicators before it throws (ProcessGroupNCCL.cpp, read through search)
        future_done_at_launch=True,
        timed_wait_aborts=True,
        # How this stack words the refusals checks look for (conformance.checks.common.refusal_words):
        # ProcessGroupNCCL refuses a strided P2P tensor with "Tensors for P2P must be non-overlapping and
        # dense" (in torch 2.15.0's libtorch_cuda.so); NCCL refuses config with "Invalid config
        # cgaClusterSize attribute value %d" and "Invalid config min/max channels attribute value %d/%d"
        # (NCCL 2.30.7 src/init.cc:2320, 2328; 2.28.9 :1860, 1870), which torch passes on as "Last error".
        refusal_words={
            "non-contiguous P2P": ("non-overlapping and dense",),
            "cga_cluster_size": ("cgaClusterSize",),
            "min_ctas": ("min/max channels", "minCTAs"),
            "max_ctas": ("min/max channels", "maxCTAs"),
        },
    )

    @property
    def stack(self) -> str:
        """What this torch's "nccl" builds (``torch_compat.default_stack``)."""
        return default_stack()

    def unavailable_reason(self, world_size: int = 1) -> str | None:
        """None when this torch has CUDA and NCCL and NVML shows a GPU per local rank; never initialises CUDA.

        Called in the parent of the rank pools, so it counts GPUs through NVML (see
        conformance.gpu.devices): a parent that called torch.cuda.is_available() poisons fork.
        """
        if not torch.backends.cuda.is_built():
            return f"no CUDA device visible (torch {torch.__version__} is a build without CUDA)"
        if not dist.is_nccl_available():
            return f"torch {torch.__version__} was built without NCCL"
        try:
            visible = visible_devices()
        except NvmlUnavailable as exc:
            return f"no CUDA device visible (NVML: {exc}; torch {torch.__version__})"
        if visible is not None and not visible:
            return f"no CUDA device visible (NVML lists none{_visible_note()}; torch {torch.__version__})"
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if visible is not None and local_size > len(visible):
            return f"world size {world_size} needs {local_size} GPUs on this host, {len(visible)} visible"
        return None

    @property
    def observes(self) -> frozenset[str]:
        """Communicators and warnings always; launches where the flight recorder shows this target's ops
        (ProcessGroupNCCL's; not ProcessGroupNCCL2's, see NCCL2_PROBE_NOTE); destroyed communicators on
        ProcessGroupNCCL, whose destroy_process_group(subgroup) was seen to make NCCL log its communicator's
        'Destroy COMPLETE' before returning (torch 2.11.0, NCCL 2.28.9, eager and lazy: tests/gpu/samples/
        captured/*subgroup_destroy*); ProcessGroupNCCL2's teardown was not seen."""
        legacy = not nccl_is_torchcomms_engine()
        launches = {"launch"} if (self.c10d_records_launches and flight_recorder_usable() and legacy) else set()
        return frozenset({"comm_created", "warning", *launches, *({"comm_destroyed"} if legacy else set())})

    def device(self, rank: int) -> torch.device:
        """cuda:<local rank>."""
        return torch.device("cuda", local_rank(rank))

    def driver(self) -> NcclDriver:
        return NcclDriver(self)

    def environment(self) -> dict[str, Any]:
        """torch, CUDA and NCCL versions, the driver and the GPU model (through NVML: no CUDA init here)."""
        impl = "ProcessGroupNCCL2" if nccl_is_torchcomms_engine() else "ProcessGroupNCCL"
        env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl_backend": impl,
                               "stack": self.stack}
        if impl == "ProcessGroupNCCL2":
            env["nccl_probe"] = NCCL2_PROBE_NOTE
        if dist.is_nccl_available():
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            visible = visible_devices()
            if visible:
                env["gpu"] = device_names(visible[:1])[0]
            env["driver"] = driver_version()
        except NvmlUnavailable:
            pass
        return env


class NcclDriver(Driver):
    """Routes NCCL's log to a per-process file, enables the flight recorder, binds cuda:<local rank>."""

    target: NcclTarget

    def __init__(self, target: NcclTarget) -> None:
        super().__init__(target)
        self._nccl: NcclProbe | None = None
        self._set_up = False

    def setup(self, rank: int, world_size: int) -> None:
        """Route NCCL's INIT/ENV log to a per-process file and enable the flight recorder."""
        os.environ.setdefault("NCCL_DEBUG_FILE", str(_debug_file(rank)))
        if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
            os.environ["NCCL_DEBUG"] = "INFO"
        subsys = {s for s in os.environ.get("NCCL_DEBUG_SUBSYS", "").upper().split(",") if s}
        if "ALL" not in subsys:  # DESTROY: NCCL 2.30+ logs "Destroy COMPLETE" there (older ones ignore the name)
            os.environ["NCCL_DEBUG_SUBSYS"] = ",".join(sorted(subsys | {"INIT", "ENV", "DESTROY"}))
        if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:  # the name torch 2.13 deprecates
            os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER_SIZE)
        self._set_up = True
        super().setup(rank, world_size)

    def own_probe(self) -> NcclProbe:
        """The NCCL log and flight recorder reader (setup() has pointed NCCL's log at its file)."""
        if not self._set_up:
            raise RuntimeError(f"target {self.name}: probe() called before setup()")
        log_path = Path(expand_debug_file(os.environ["NCCL_DEBUG_FILE"], socket.gethostname(), os.getpid()))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        observes = self.target.observes
        self._nccl = NcclProbe(log_path, _dump if "launch" in observes else None,
                               destroys="comm_destroyed" in observes)
        return self._nccl

    def init_world(
        self, store: dist.Store, rank: int, world_size: int, spec: WorldSpec, timeout_s: float
    ) -> dist.ProcessGroup:
        """init_process_group on the store; eager binds cuda:<local rank> as device_id."""
        device = self.device(rank)
        torch.cuda.set_device(device)
        world = self._init_default_group(store, rank, world_size, spec, timeout_s,
                                         device if spec.mode == "eager" else None)
        self.probe()
        assert self._nccl is not None
        self._nccl.world_initialised(store, rank)
        return world


def _visible_note() -> str:
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if spec is None else f" under CUDA_VISIBLE_DEVICES={spec!r}"
