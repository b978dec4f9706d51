"""SimProcessGroup: the simulator as a torch.distributed ProcessGroup (out-of-tree backend)."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from simulator import faults
from simulator.comm import Communicator, hosts_store, release_namespace, rendezvous, root_store, world_namespace
from simulator.config import SimOptions, parse_hints
from simulator.control import Boot
from simulator.errors import refuse_sparse
from simulator.events import LOG
from simulator.fabric import Fabric
from simulator.mailbox import Mailbox
from simulator.p2p import recv_any
from simulator.parts import REFERENCE, Parts
from simulator.work import SimWork

REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
LEAVE_WAIT_S = 10.0  # how long the world's rank 0 waits at teardown for its peers to be done with the store
LAZY_P2P_WARNING = (
    "simulator: send/recv on a lazily initialised group create a 2-rank communicator per "
    "peer pair; pass device_id to init_process_group to bind a device so P2P reuses the "
    "group communicator"
)


@dataclass(frozen=True)
class SimSettings:
    """What a simulator backend models, fixed when it is registered (``simulator.defects.resolve``): the
    ``stack`` it models, the planted ``defects`` by name, and the classes both resolve to (``group``, the
    process group class; ``parts``, the rest), under the backend ``name`` it is registered as. A world keeps its
    creator's; its subgroups keep the world's, but for a group of another simulator backend (another name)."""

    name: str = "sim"
    stack: str = "nccl-legacy"
    defects: frozenset[str] = frozenset()
    group: type[SimProcessGroup] | None = None
    parts: Parts = REFERENCE

    @property
    def group_class(self) -> type[SimProcessGroup]:
        """The process group class worlds are made of."""
        return self.group or SimProcessGroup


def reduce_op_name(op: Any) -> str:
    """'sum', 'avg', ... for a torch ReduceOp."""
    for name in REDUCE_OPS:
        if op == getattr(dist.ReduceOp, name):
            return name.lower()
    known = next((n for n in ("BAND", "BOR", "BXOR", "PREMUL_SUM") if op == getattr(dist.ReduceOp, n, None)), op)
    raise ValueError(f"simulator: unsupported reduce op {known} (supported: {', '.join(REDUCE_OPS)})")


def _timeout_s(timeout: Any) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 300)


class SimProcessGroup(dist.ProcessGroup):
    """A process group whose communicators are simulated, with real data in shared memory."""

    def __init__(self, store: dist.Store, rank: int, size: int, global_ranks: list[int],
                 options: SimOptions | None, timeout_s: float, *, comm_store: dist.Store,
                 prefix: str, root: dist.Store | None = None, namespace: str = "",
                 comm: Communicator | None = None, is_world: bool = False,
                 settings: SimSettings = SimSettings()) -> None:
        super().__init__(rank, size)
        self._settings = settings
        self._parts = settings.parts
        self._store = store
        self._comm_store = comm_store
        self._global_ranks = global_ranks
        self._timeout_s = timeout_s
        self._prefix = prefix
        self._root, self._namespace = root, namespace
        self._options = options if options is not None else SimOptions()
        self._validate(self._options)
        self._config = self._effective_config(self._options, comm_name="pending")
        self._comm = comm
        self._is_world = is_world
        self._released = False
        self._left = False
        self._store_hosted: bool | None = None  # whether a member hosts the store, from the world's boot records
        self._split_boot: tuple[str, Boot] | None = None  # a split's child id and mailboxes, for _new_comm
        self._pair_comms: dict[tuple[int, int], Communicator] = {}
        self._warned = False
        self._coalescing: list[tuple[Communicator, str, Callable[[Fabric], Any]]] | None = None
        self._name = ""

    # --- identity --------------------------------------------------------------------------
    def getBackendName(self) -> str:
        """The backend's name (the one it was registered as)."""
        return self._settings.name

    def setGroupName(self, name: str) -> None:
        """Called by torch with the group's name."""
        self._name = name

    def getGroupName(self) -> str:
        """The group's name."""
        return self._name

    @property
    def group_name(self) -> str:
        """The group's name."""
        return self._name

    @property
    def my_global_rank(self) -> int:
        """This process's rank in the world."""
        return self._global_ranks[self.rank()]

    @property
    def options(self) -> SimOptions:
        """The options this group was created with (torch deep-copies them for split children)."""
        return self._options

    @property
    def supports_splitting(self) -> bool:
        """Splitting is supported (ncclCommSplit semantics)."""
        return True

    @property
    def supports_coalescing(self) -> bool:
        """Coalescing of collectives is supported."""
        return True

    def _get_backend(self, device: Any) -> SimProcessGroup:
        return self

    def _set_sequence_number_for_group(self) -> None:
        pass

    def get_group_store(self) -> dist.Store:
        """The store torch registers for this group."""
        return self._store

    def comm_split_count(self) -> int:
        """How many splits this group's communicator has done."""
        return self._comm.split_count if self._comm else 0

    def effective_config(self) -> dict[str, Any]:
        """The config the group's communicator has (or will get at its lazy creation): a copy, which the caller may
        edit without changing the group's (docs/vendor-guide.md, ``conformance_effective_config``)."""
        return dict(self._comm.config if self._comm is not None else self._config)

    def creation_binding(self, bound: Any) -> Any:
        """The device the group is bound to when created: the one torch bound it to (``device_id=``), if any."""
        return bound

    #: whether torch's front end makes every new_group of this world through split_group, whatever its backend
    #: (the torchcomms routing): then a members-only group is refused for every backend, not only the world's
    new_group_via_split = False
    #: whether a new_group of the world's backend in a bound world gets a communicator split from the world's
    #: (else a fresh one among its members, created when torch names the group)
    new_group_splits = True

    def refuse_local_synchronization(self, ranks: list[int]) -> None:
        """Refuse a members-only new_group (``use_local_synchronization=True``) of ``ranks`` in this bound world:
        its communicator would be split from the world's, a split every rank of the world must join (as
        ncclCommSplit; NCCL hangs there, NVIDIA-NeMo/RL PR 3189, and pytorch PR 129965 proposed this refusal)."""
        raise RuntimeError(
            f"rank {self.my_global_rank}: new_group(ranks={ranks}, use_local_synchronization=True) in a world bound "
            f"to {self.bound_device_id}: the group's communicator is split from the world's, which all "
            f"{self.size()} ranks must join, but only the members call new_group (NCCL hangs here); call new_group "
            "on every rank (use_local_synchronization=False) or use split_group")

    def splits_unbound(self) -> bool:
        """Whether torch may split this group while the world has no bound device: no (torch <= 2.14 refuses
        that split itself, v2.14.1 distributed_c10d.py:6610)."""
        return False

    @property
    def settings(self) -> SimSettings:
        """The stack and planted defects this group's backend was created with."""
        return self._settings

    def _validate(self, options: SimOptions) -> None:
        """Refuse invalid options (a ConfigError naming key and value)."""
        options.validate()

    def _warn_hint(self, message: str) -> None:
        """Warn about a hint the communicator ignores."""
        LOG.warn(message, RuntimeWarning)

    def _effective_config(self, options: SimOptions, comm_name: str, warn: bool = True) -> dict[str, Any]:
        """The communicator config for ``options`` (unknown hints are warned about unless ``warn`` is off)."""
        config = options.as_config()
        config["hints"] = parse_hints(options.hints, comm_name, self._warn_hint if warn else None)
        return config

    @property
    def communicator(self) -> Communicator | None:
        """The group's main communicator, once created."""
        return self._comm

    # --- communicator lifecycle --------------------------------------------------------------
    def eager_connect_single_device(self, device: Any) -> None:
        """Create the group communicator now (called by the virtual device binding shim)."""
        if self._comm is None:
            self._comm = self._bootstrap("eager", device=str(device))

    def _comm_base(self) -> str:
        """The id of the group's communicator (pair communicators add to it): from the group's unique name."""
        return f"c{self._name[:10]}"

    def _bootstrap(self, mode: str, device: str | None = None) -> Communicator:
        comm_id = self._comm_base()
        members = list(self._global_ranks)
        box = Mailbox(len(members)) if len(members) > 1 else None  # its reference goes in the boot record
        hosts = self._is_world and hosts_store(self._root)
        record = json.dumps({"mailbox": box.ref if box else "", "hosts_store": hosts})
        try:
            records = rendezvous(self._comm_store, f"boot/{comm_id}", self.my_global_rank, members,
                                 self._timeout_s, f"creating communicator {comm_id} ({mode})", value=record)
        except BaseException:
            if box is not None:
                box.close()
            raise
        got = [json.loads(r) for r in records or ()]
        if self._is_world:
            self._store_hosted = any(g["hosts_store"] for g in got)
        self._release_namespace()  # every member has arrived, so read the world's uid
        config = self._lazy_subgroup_config() if mode == "lazy" and not self._is_world else self._config
        boot = Boot(box, [g["mailbox"] for g in got]) if box is not None else None
        return self._new_comm(comm_id, members, mode, device=device, config=config, boot=boot)

    def _lazy_subgroup_config(self) -> dict[str, Any]:
        """The config of a subgroup's communicator created lazily, at its first use: the group's own."""
        return self._config

    def _new_comm(self, comm_id: str, members: list[int], mode: str, *, parent: str | None = None,
                  device: str | None = None, config: dict[str, Any] | None = None,
                  recorded: bool = True, boot: Boot | None = None) -> Communicator:
        if boot is None and self._split_boot is not None and self._split_boot[0] == comm_id:
            boot, self._split_boot = self._split_boot[1], None  # the split's records carried its mailboxes
        return Communicator(
            id=comm_id, members=members, rank=self.my_global_rank, mode=mode,
            config=self._config if config is None else config, store=self._comm_store, parts=self._parts,
            timeout_s=self._timeout_s, prefix=self._prefix, parent=parent, device=device,
            root=self._root, namespace=self._namespace, recorded=recorded, boot=boot,
        )

    def _main_comm(self) -> Communicator:
        if self._comm is None:
            self._comm = self._bootstrap("lazy")
        return self._comm

    def split_comm(self, members: list[int] | None, config: dict[str, Any]) -> Communicator | None:
        """ncclCommSplit: every member of this group's communicator calls; None for no-color."""
        parent = self._main_comm()
        n = parent.split_count
        parent.split_count += 1
        key = f"split/{parent.id}/{n}"
        me = self.my_global_rank
        # each rank's colour (data, never pickle, from a store) and, for a member, its mailbox in the child
        box = Mailbox(len(members)) if members is not None and len(members) > 1 else None
        handed = False
        try:
            records = rendezvous(self._comm_store, f"{key}/color", me, parent.members, self._timeout_s,
                                 f"split #{n} of communicator {parent.id}",
                                 value=json.dumps([members, box.ref if box else ""])) or []
            outside = [m for m in members or () if m not in parent.members]
            if outside:  # as in ncclCommSplit, the child waits for every member: one outside the parent never comes
                rendezvous(self._comm_store, f"{key}/outside", me, outside, self._timeout_s,
                           f"split #{n} of communicator {parent.id} (ranks {outside} outside the parent)")
            got = {r: json.loads(v) for r, v in zip(parent.members, records)}
            colors = {r: g[0] for r, g in got.items()}
            for rank, group in colors.items():  # every rank checks every colour: all raise, or none does
                for other in group or ():
                    if colors.get(other) != group:
                        raise ValueError(
                            f"rank {me}: split #{n} of {parent.id}: rank {rank} asked for group {group} "
                            f"but rank {other} asked for {colors.get(other)}"
                        )
            if members is None:
                return None
            child_id = self._child_comm_id(parent, n, members)
            if box is not None:
                self._split_boot, handed = (child_id, Boot(box, [got[m][1] for m in members])), True
            return self._split_child(parent, child_id, members, config)
        finally:
            if box is not None and (not handed or self._split_boot is not None):  # no communicator took it
                box.close()
            self._split_boot = None

    def _child_comm_id(self, parent: Communicator, n: int, members: list[int]) -> str:
        """The id of the child of split #``n`` of ``parent``: unique per split."""
        return f"{parent.id}.s{n}r{members[0]}"

    def _split_child(self, parent: Communicator, child_id: str, members: list[int],
                     config: dict[str, Any]) -> Communicator:
        """The child communicator of a split: split from ``parent``, on the parent's device."""
        return self._new_comm(child_id, members, "split", parent=parent.id, device=parent.device, config=config)

    def perform_nocolor_split(self, device: Any) -> None:
        """Take part in a split (new_group under eager init) as a non-member."""
        self.split_comm(None, {})

    def split_group(self, ranks: list[int], timeout: Any = None, opts: Any = None, group_name: str = "",
                    group_desc: str = "", device_types: Any = None) -> SimProcessGroup | None:
        """torch.distributed.split_group's backend half: every parent rank calls it."""
        bad = [r for r in ranks if not 0 <= r < self.size()]
        if bad:
            self._refuse_outside(bad)
        member = self.rank() in ranks
        options = self._child_options(opts)
        config = self._child_config(options, opts)
        members = self._split_members(ranks)
        comm = self.split_comm(members if member else None, config)
        if comm is None:
            return None
        if timeout:
            comm.retime(_timeout_s(timeout))
        child = type(self)(
            dist.PrefixStore(f"{group_name}/", self._comm_store), ranks.index(self.rank()), len(ranks),
            members, options, _timeout_s(timeout) if timeout else self._timeout_s,
            comm_store=self._comm_store, prefix=self._prefix, root=self._root, namespace=self._namespace, comm=comm,
            settings=self._settings,
        )
        child.setGroupName(group_name)
        return child

    def _refuse_outside(self, bad: list[int]) -> None:
        """Refuse a split naming the ranks outside this group and its size."""
        raise ValueError(
            f"rank {self.my_global_rank}: split_group: ranks {bad} are outside the parent group "
            f"of size {self.size()} (valid group ranks are 0..{self.size() - 1})"
        )

    def _split_members(self, ranks: list[int]) -> list[int]:
        """The global ranks of a split's members, from its group ranks, in the caller's order (torch >= 2.14
        keeps it, v2.15.0 distributed_c10d.py:6815; 2.13 sorts first)."""
        return [self._global_ranks[r] for r in ranks]

    def _child_options(self, opts: Any) -> SimOptions:
        """A split child's options: those given, else a deep copy of this group's."""
        if opts is None:
            return copy.deepcopy(self._options)
        if not isinstance(opts, SimOptions):
            raise TypeError(f"simulator: pg_options must be simulator.SimOptions, got {type(opts).__name__}")
        return opts

    def _child_config(self, options: SimOptions, opts: Any) -> dict[str, Any]:
        """A split child's communicator config, from its options (validated)."""
        self._validate(options)
        return self._effective_config(options, comm_name="split")

    def shutdown(self) -> None:
        """Destroy every communicator of this group (the world's rank 0 also releases the world's uid key, and
        leaves last: ``_leave_together``)."""
        for comm in [self._comm, *self._pair_comms.values()]:
            if comm is not None:
                comm.destroy()
        self._comm = None
        self._pair_comms.clear()
        self._release_namespace()
        if self._is_world and not self._left:
            self._left = True
            self._leave_together()

    def _leave_together(self) -> None:
        """Every rank of the world posts that it is done with the store; a rank that hosts the store's server
        (rank 0 under tcp:// or env:// init) waits (at most LEAVE_WAIT_S) until each rank has: its
        destroy_process_group drops the server, and a peer still finishing its last op on the store then
        failed with "Connection was likely closed" (issue 24: about 1 world in 10). A peer that never tears
        down costs the host that wait, once; where the store lives elsewhere (the suite's pools, torchrun's
        agent) nobody waits, and where the world's communicator was booted its records said so: no rank posts."""
        if self._store_hosted is False:  # the world's boot records say no member hosts it: nobody waits
            return
        with contextlib.suppress(Exception):  # a store already gone, or a peer that never comes: leave anyway
            self._comm_store.set(f"left/{self.rank()}", b"1")
            if hosts_store(self._root):
                wait_s = min(self._timeout_s, LEAVE_WAIT_S)
                self._comm_store.wait([f"left/{r}" for r in range(self.size())], timedelta(seconds=wait_s))

    def _release_namespace(self) -> None:
        """On the world's rank 0, once: delete the world's uid key (simulator.comm.release_namespace). Done
        after the world communicator's boot rendezvous, where rank 0 usually waits for a peer anyway, or
        at shutdown when the world never made one."""
        if self._is_world and self.rank() == 0 and not self._released:
            self._released = True
            release_namespace(self._store)

    def abort(self) -> None:
        """Same as shutdown for the simulator."""
        self.shutdown()

    # --- launches ----------------------------------------------------------------------------
    def _launch(self, op: str, fn: Callable[[Fabric], Any], ops: int = 1, coalesced: bool = False,
                outputs: list[Any] | None = None, p2p: bool = False) -> SimWork:
        faults.maybe_inject(self.my_global_rank, op)
        work = self._parts.p2p_work if p2p else self._parts.work
        return work(self._main_comm().launch(op, fn, ops=ops, coalesced=coalesced), outputs=outputs)

    def _coalesced(self, op: str, run: Callable[[Fabric, slice], Any], count: int, async_op: bool,
                   outputs: list[torch.Tensor] | None = None) -> SimWork | None:
        """One launch, one exchange for a whole coalesced block (``run(fabric, which_ops)``)."""
        return self._launch(f"{op}_coalesced", lambda f: run(f, slice(0, count)), ops=count, coalesced=True,
                            outputs=outputs)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        """In-place all-reduce."""
        refuse_sparse("all_reduce", tensors, self.my_global_rank)
        op = reduce_op_name(opts.reduceOp) if opts is not None else "sum"
        return self._launch("allreduce", lambda f: f.all_reduce(tensors, op), outputs=tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork | None:
        """All tensors of a coalesced block in one launch and one exchange."""
        op = reduce_op_name(opts.reduceOp)
        return self._coalesced("allreduce", lambda f, s: f.all_reduce(tensors[s], op), len(tensors),
                               bool(getattr(opts, "asyncOp", False)), outputs=tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        """all_gather into a list of tensors."""
        return self._launch("allgather", lambda f: f.all_gather(outputs[0], inputs[0]), outputs=outputs[0])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        """all_gather_into_tensor."""
        return self._launch("allgather_into_tensor", lambda f: f.all_gather_into_tensor([output], [input]),
                            outputs=[output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> SimWork | None:
        """Coalesced all_gather_into_tensor."""
        return self._coalesced("allgather_into_tensor", lambda f, s: f.all_gather_into_tensor(outputs[s], inputs[s]),
                               len(inputs), bool(getattr(opts, "asyncOp", False)), outputs=outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        """reduce_scatter_tensor."""
        op = reduce_op_name(opts.reduceOp)
        return self._launch("reduce_scatter_tensor", lambda f: f.reduce_scatter_tensor([output], [input], op),
                            outputs=[output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> SimWork | None:
        """Coalesced reduce_scatter_tensor."""
        op = reduce_op_name(opts.reduceOp)
        return self._coalesced("reduce_scatter_tensor",
                               lambda f, s: f.reduce_scatter_tensor(outputs[s], inputs[s], op), len(inputs),
                               bool(getattr(opts, "asyncOp", False)), outputs=outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        """Broadcast from opts.rootRank (group rank)."""
        root = opts.rootRank
        return self._launch("broadcast", lambda f: f.broadcast(tensors, root), outputs=tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        """Reduce to opts.rootRank."""
        op = reduce_op_name(opts.reduceOp)
        return self._launch("reduce", lambda f: f.reduce(tensors, opts.rootRank, op), outputs=tensors)

    def barrier(self, opts: Any = None) -> SimWork:
        """Barrier over the group communicator."""
        return self._launch("barrier", lambda f: f.barrier())

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> SimWork:
        """all_to_all_single with optional split sizes."""
        return self._launch("all_to_all_single", lambda f: f.all_to_all_single(
            output, input, output_split_sizes or None, input_split_sizes or None), outputs=[output])

    alltoall_base = all_to_all_single

    # --- rooted and list-form collectives (those ProcessGroupGloo also implements on CPU) ----------
    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        """gather to opts.rootRank (the root passes one output list, other ranks none)."""
        root, outs = opts.rootRank, outputs[0] if outputs else []
        return self._launch("gather", lambda f: f.gather(outs, inputs[0], root), outputs=outs)

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        """gather into one tensor on opts.rootRank (torch 2.15's gather_single)."""
        root = opts.rootRank
        return self._launch("gather_single", lambda f: f.gather_single(output, input, root),
                            outputs=[output] if self.rank() == root else [])

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> SimWork:
        """scatter from opts.rootRank (the root passes one input list, other ranks none)."""
        root, ins = opts.rootRank, inputs[0] if inputs else []
        return self._launch("scatter", lambda f: f.scatter(outputs[0], ins, root), outputs=outputs)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        """all_to_all over lists of tensors (sizes may differ between pairs)."""
        return self._launch("alltoall", lambda f: f.all_to_all(outputs, inputs), outputs=outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> SimWork:
        """reduce_scatter over a list of input tensors."""
        op = reduce_op_name(opts.reduceOp)
        return self._launch("reduce_scatter", lambda f: f.reduce_scatter(outputs[0], inputs[0], op), outputs=outputs)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> SimWork:
        """all_gather of a list of tensors in one launch: outputs[rank][k] := that rank's inputs[k]."""
        return self._launch("allgather_coalesced", lambda f: f.all_gather_coalesced(outputs, inputs),
                            ops=len(inputs), coalesced=True, outputs=outputs)

    # --- point to point -----------------------------------------------------------------------
    def _warn_lazy_p2p(self) -> None:
        """Warn, once per group, that lazily initialised P2P creates pair communicators."""
        if not self._warned:
            self._warned = True
            LOG.warn(LAZY_P2P_WARNING)

    @staticmethod
    def _pair(me: int, peer: int) -> tuple[int, int]:
        return (min(me, peer), max(me, peer))

    @property
    def p2p_on_group_comm(self) -> bool:
        """Whether this stack's unbatched P2P would run on the group's communicator (nccl-legacy's rule: the group
        was bound to a device when made, ProcessGroupNCCL's eagerInit_); otherwise on lazily created pair
        communicators. nccl-lazy keeps pair communicators whatever this says (its own _p2p_comm)."""
        return self.bound_device_id is not None

    def _p2p_comm(self, peer_group_rank: int) -> tuple[Communicator, int, str]:
        """(communicator, the peer's rank in it, stream) for unbatched P2P with a group rank: the group's
        communicator where the group was bound to a device when made (eager), else the pair's lazily created
        2-rank communicator, also once a collective has made the group's own: ProcessGroupNCCL::pointToPoint
        reuses the group's communicator only under eagerInit_, which only eagerConnectSingleDevice sets, and
        otherwise keys unbatched P2P by the pair (getKeySendRecv) and warns (TORCH_WARN_ONCE)."""
        peer = self._global_ranks[peer_group_rank]
        pair = self._pair(self.my_global_rank, peer)
        if self.p2p_on_group_comm:
            comm = self._main_comm()
        else:
            self._warn_lazy_p2p()
            comm = self._pair_comm(pair)
        return comm, comm.local(peer), f"p2p:{pair[0]}-{pair[1]}"

    def _batched_p2p_comm(self, peer_group_rank: int) -> tuple[Communicator, int, str]:
        """(communicator, the peer's rank in it, stream) for P2P inside a batch (batch_isend_irecv, a coalescing
        block): the group's communicator, made now where the group has none. ProcessGroupNCCL keys a batch's P2P
        by the device, as a collective (pointToPoint's batchP2P branch: ncclActiveGroupCounter_ > 0 after
        startCoalescing's groupStart), with no warning; so a lazy group's first batch makes the group's
        communicator and every member must take part (torch's batch_isend_irecv docstring, v2.13.0
        distributed_c10d.py:3031-3036)."""
        comm = self._main_comm()
        return comm, comm.local(self._global_ranks[peer_group_rank]), "p2p:batch"

    def _pair_comm(self, pair: tuple[int, int], recorded: bool = True) -> Communicator:
        """The 2-rank communicator of ``pair``, created on its first use."""
        if pair not in self._pair_comms:
            self._pair_comms[pair] = self._new_comm(f"{self._comm_base()}.p{pair[0]}x{pair[1]}", list(pair), "p2p",
                                                    recorded=recorded)
        return self._pair_comms[pair]

    def _refuse_peer(self, op: str, peer: int) -> None:
        """Refuse P2P with an invalid group rank (this rank's own, or outside the group)."""
        what = "destination" if op == "send" else "source"
        raise ValueError(f"rank {self.my_global_rank}: {op}: invalid {what} group rank {peer} "
                         f"(group of size {self.size()}, own rank {self.rank()})")

    def _p2p(self, op: str, peer: int, fn: Callable[[Fabric, int], Any],
             tensors: list[torch.Tensor] | None = None) -> SimWork | None:
        if peer == self.rank() or not 0 <= peer < self.size():
            self._refuse_peer(op, peer)
        faults.maybe_inject(self.my_global_rank, op)
        comm, local_peer, stream = (self._p2p_comm if self._coalescing is None else self._batched_p2p_comm)(peer)
        if op == "recv":  # posted now, in program order: rendezvous sends wait for this
            comm.fabric.post_receive(local_peer)
        if self._coalescing is not None:
            self._coalescing.append((comm, op, lambda f, lp=local_peer: fn(f, lp)))
            return None
        fut = comm.launch(op, lambda f: fn(f, local_peer), stream=stream)
        return self._parts.p2p_work(fut, source_rank=peer, outputs=tensors)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> SimWork | None:
        """Buffered send to group rank dstRank."""
        t = tensors[0]
        return self._p2p("send", dstRank, lambda f, p: f.send(t, p, tag), tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> SimWork | None:
        """Receive from group rank srcRank."""
        t = tensors[0]

        def receive(f: Fabric, peer: int) -> int:
            self._receive(f, t, peer, tag)
            return srcRank

        return self._p2p("recv", srcRank, receive, tensors)

    def _receive(self, fabric: Fabric, tensor: torch.Tensor, peer: int, tag: int) -> None:
        """Receive into ``tensor`` from the communicator's rank ``peer`` (a size or dtype mismatch raises)."""
        fabric.recv(tensor, peer, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> SimWork:
        """Receive from whichever rank sends first (on a group not bound when made: on the pair communicator of
        every peer, as its unbatched P2P)."""
        if not self.p2p_on_group_comm:
            return self._recv_anysource_lazy(tensors[0], tag)
        comm = self._main_comm()
        comm.fabric.post_receive(None)
        t = tensors[0]
        def any_source(f: Fabric) -> int:
            return self._source_group_rank(comm, f.recv(t, None, tag))

        fut = comm.launch("recv", any_source, stream="p2p:any")
        return self._parts.p2p_work(fut, outputs=tensors)

    def _source_group_rank(self, comm: Communicator, local: int) -> int:
        """The group rank of the sender a receive from any source matched (``local``: its rank in ``comm``)."""
        return self._global_ranks.index(comm.members[local])

    def _recv_anysource_lazy(self, t: torch.Tensor, tag: int) -> SimWork:
        """A lazy group's receive from any source: on the pair communicator of every peer at once."""
        peers = [p for p in range(self.size()) if p != self.rank()]
        pairs = [self._p2p_comm(p)[:2] for p in peers]
        for comm, _ in pairs:
            comm.fabric.post_receive(None)

        def any_source(_: Fabric) -> int:
            comm, local = pairs[recv_any([(comm.fabric.p2p, local) for comm, local in pairs], t, tag)]
            return self._source_group_rank(comm, local)

        fut = pairs[0][0].launch("recv", any_source, stream="p2p:any")
        return self._parts.p2p_work(fut, outputs=[t])

    def _start_coalescing(self, device: Any) -> None:
        self._coalescing = []

    def _end_coalescing(self, device: Any) -> SimWork:
        """One launch per communicator the block's P2P ops use (the group's, or lazy pair ones),
        sends before receives; every receive was posted when issued, so rendezvous sends complete."""
        # torch >= 2.14 coalesces batch_isend_irecv for Python groups too (v2.14.1 distributed_c10d.py:3683)
        ordered = self._end_block()
        by_comm: dict[str, tuple[Communicator, list[Callable[[Fabric], Any]]]] = {}
        for comm, _, fn in ordered:
            by_comm.setdefault(comm.id, (comm, []))[1].append(fn)
        if not by_comm or (self._comm is not None and list(by_comm) == [self._comm.id]):
            fns = [fn for _, _, fn in ordered]
            return self._launch("p2p_coalesced", lambda f: [fn(f) for fn in fns], ops=len(fns), coalesced=True,
                                p2p=True)
        futures = [comm.launch("p2p_coalesced", lambda f, fns=fns: [fn(f) for fn in fns], ops=len(fns), coalesced=True)
                   for comm, fns in by_comm.values()]
        every = torch.futures.collect_all(futures).then(lambda done: [f.value() for f in done.value()])
        return self._parts.p2p_work(every)  # value() re-raises the first launch error

    def _end_block(self) -> list[tuple[Communicator, str, Callable[[Fabric], Any]]]:
        """The ops queued since ``_start_coalescing``, sends before receives; ends the block."""
        ops, self._coalescing = self._coalescing or [], None
        return [o for o in ops if o[1] == "send"] + [o for o in ops if o[1] == "recv"]


def creator(settings: SimSettings) -> Callable[[Any, Any], SimProcessGroup]:
    """The creator to register for a backend with ``settings``."""
    return functools.partial(create, settings)


def create(settings: SimSettings, common: Any, pg_options: Any) -> SimProcessGroup:
    """The creator torch calls (extended API) for every group whose backend is 'sim': a world takes
    ``settings``, a subgroup its world's."""
    if pg_options is not None and not isinstance(pg_options, SimOptions):
        raise TypeError(f"simulator: pg_options must be simulator.SimOptions, got {type(pg_options).__name__}")
    store, rank, size = common.store, common.group_rank, common.group_size
    global_ranks = list(common.global_ranks_in_group) or list(range(size))
    timeout_s = _timeout_s(common.timeout)
    is_world = not dist.is_initialized()
    # torch >= 2.14 passes the group it is building, already bound when device_id was given:
    # the simulator's group replaces it, so it keeps that binding (v2.15.0 distributed_c10d.py:3118)
    replaced = getattr(common, "process_group", None)
    bound = replaced.bound_device_id if replaced is not None else None
    if is_world:
        if pg_options is not None:
            pg_options = settings.parts.creator.world_options(pg_options)
        prefix, namespace = world_namespace(store, rank)
        root = root_store(store)
        # every world under its own uid, on any store: a world made again on a store object an earlier one used
        # (its group names restart at "0" after destroy_process_group) must not meet that world's keys
        comm_store = dist.PrefixStore(namespace, root if root is not None else store)
        world = settings.group_class(store, rank, size, global_ranks, pg_options, timeout_s, comm_store=comm_store,
                                     prefix=prefix, root=root, namespace=namespace if root is not None else "",
                                     is_world=True, settings=settings)
        world.bound_device_id = world.creation_binding(bound)
        return world
    world = dist.distributed_c10d._get_default_group()
    if not isinstance(world, SimProcessGroup):
        raise RuntimeError(f"simulator: a '{settings.name}' subgroup needs a simulator default group")
    # a group of another simulator backend (torch 2.15 registers nccl-lazy beside nccl, v2.15.0
    # distributed_c10d.py:1015) is that backend's own: never split from the world's communicator, its own
    # bootstraps among its members (eagerly where torch binds it), so its members alone may create it
    other = settings.name != world.settings.name
    own = settings if other else world.settings
    options = pg_options
    if options is not None:
        options = own.parts.creator.subgroup_options(options)
    group = (own.group_class if other else type(world))(
        store, rank, size, global_ranks, options, timeout_s, comm_store=world._comm_store, prefix=world._prefix,
        root=world._root, namespace=world._namespace, settings=own)
    # torch binds every group of a bound world (device_id defaults to the world's, v2.13.0 distributed_c10d.py:5964,
    # set at :2096) and keeps that group for the C++ backends the simulator models; its Python group replaces it
    # (:2278-2279), so it carries the binding itself, whichever simulator backend it is
    group.bound_device_id = bound if bound is not None else world.bound_device_id
    # a group of the world's backend splits from its communicator, else its own is created when torch names it;
    # in group-rank order: ncclCommSplit ranks the child by key, which ProcessGroupNCCL passes as the rank in the
    # new group (new_group(sort_ranks=False) keeps the order given)
    if world.bound_device_id is not None and not other and world.new_group_splits:
        group._comm = world.split_comm(list(global_ranks), group.effective_config())
        if group._comm is not None:
            group._comm.retime(timeout_s)
    return group
