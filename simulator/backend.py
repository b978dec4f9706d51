"""SimProcessGroup: the simulator as a torch.distributed ProcessGroup (out-of-tree backend)."""

from __future__ import annotations

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
from simulator.comm import Communicator, release_namespace, rendezvous, root_store, world_namespace
from simulator.config import ConfigError, SimOptions, options_to_hints, parse_hints
from simulator.defects import NONE, Defects
from simulator.errors import P2PMismatch, refuse_sparse
from simulator.events import LOG
from simulator.fabric import Fabric
from simulator.p2p import recv_any
from simulator.work import SimWork

REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
LAZY_P2P_WARNING = (
    "simulator: send/recv on a lazily initialised group create a 2-rank communicator per "
    "peer pair; pass device_id to init_process_group to bind a device so P2P reuses the "
    "group communicator"
)


PATHS = ("nccl", "torchcomms")


@dataclass(frozen=True)
class SimSettings:
    """What a simulator backend models, fixed when it is registered: the integration ``path`` ("nccl" or
    "torchcomms") and its planted ``defects``. A world keeps its creator's; its subgroups keep the world's."""

    path: str = "nccl"
    defects: Defects = NONE

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"simulator: path must be one of {', '.join(PATHS)}, got {self.path!r}")


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
        self._defects = settings.defects
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
        self._pair_comms: dict[tuple[int, int], Communicator] = {}
        self._pair_ops: dict[tuple[int, int], int] = {}
        self._warned = False
        self._coalescing: list[tuple[Communicator, str, Callable[[Fabric], Any]]] | None = None
        self._name = ""

    # --- identity --------------------------------------------------------------------------
    def getBackendName(self) -> str:
        """The backend's name."""
        return "sim"

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
        """The config the group's communicator has (or will get at its lazy creation)."""
        if not self._is_world and self._defects.on("newgroup_options_aliased"):
            return self._effective_config(self._options, comm_name=self._name, warn=False)
        return self._comm.config if self._comm is not None else self._config

    @property
    def settings(self) -> SimSettings:
        """The path and planted defects this group's backend was created with."""
        return self._settings

    def _validate(self, options: SimOptions) -> None:
        """Refuse invalid options (the invalid_options_accepted defect lets them through)."""
        try:
            options.validate()
        except ConfigError:
            if not self._defects.on("invalid_options_accepted"):
                raise

    def _warn_hint(self, message: str) -> None:
        if not self._defects.on("unknown_hint_silent"):
            LOG.warn(message, RuntimeWarning)

    def _effective_config(self, options: SimOptions, comm_name: str, warn: bool = True) -> dict[str, Any]:
        return effective_config(options, comm_name, self._settings, self._warn_hint if warn else None)

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
        if self._defects.on("comm_id_by_members"):
            return "m" + "_".join(map(str, self._global_ranks))
        return f"c{self._name[:10]}"

    def _bootstrap(self, mode: str, device: str | None = None) -> Communicator:
        comm_id = self._comm_base()
        rendezvous(self._comm_store, f"boot/{comm_id}", self.my_global_rank, self._global_ranks,
                   self._timeout_s, f"creating communicator {comm_id} ({mode})")
        self._release_namespace()  # every member has arrived, so read the world's uid
        config = None
        if mode == "lazy" and not self._is_world and self._defects.on("lazy_comm_default_config"):
            config = self._effective_config(SimOptions(), comm_name=comm_id)
        return self._new_comm(comm_id, list(self._global_ranks), mode, device=device, config=config)

    def _new_comm(self, comm_id: str, members: list[int], mode: str, *, parent: str | None = None,
                  device: str | None = None, config: dict[str, Any] | None = None,
                  recorded: bool = True) -> Communicator:
        return Communicator(
            id=comm_id, members=members, rank=self.my_global_rank, mode=mode,
            config=self._config if config is None else config, store=self._comm_store, defects=self._defects,
            timeout_s=self._timeout_s, prefix=self._prefix, parent=parent, device=device,
            root=self._root, namespace=self._namespace, recorded=recorded,
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
        self._comm_store.set(f"{key}/color/{me}", json.dumps(members))  # data, never pickle, from a store
        rendezvous(self._comm_store, f"{key}/arrive", me, parent.members, self._timeout_s,
                   f"split #{n} of communicator {parent.id}")
        outside = [m for m in members or () if m not in parent.members]
        if outside:  # only reachable with the split_out_of_range_hang defect: wait for ranks that do not exist
            rendezvous(self._comm_store, f"{key}/color", me, outside, self._timeout_s,
                       f"split #{n} of communicator {parent.id} (ranks {outside} outside the parent)")
        colors = {r: json.loads(v) for r, v in
                  zip(parent.members, self._comm_store.multi_get([f"{key}/color/{r}" for r in parent.members]))}
        for rank, group in colors.items():  # every rank checks every colour: all raise, or none does
            for other in group or ():
                if colors.get(other) != group:
                    raise ValueError(
                        f"rank {me}: split #{n} of {parent.id}: rank {rank} asked for group {group} "
                        f"but rank {other} asked for {colors.get(other)}"
                    )
        if members is None:
            return None
        child_id = f"{parent.id}.s{n}r{members[0]}"
        if self._defects.on("comm_id_by_members"):
            child_id = "m" + "_".join(map(str, members))
        if self._defects.on("split_fresh_bootstrap"):
            rendezvous(self._comm_store, f"boot/{child_id}", me, members, self._timeout_s,
                       f"creating communicator {child_id}")
            return self._new_comm(child_id, members, "eager", device=parent.device, config=config)
        device = None if self._defects.on("split_child_unbound") else parent.device
        return self._new_comm(child_id, members, "split", parent=parent.id, device=device, config=config)

    def perform_nocolor_split(self, device: Any) -> None:
        """Take part in a split (new_group under eager init) as a non-member."""
        if self._defects.on("split_nonmember_raises"):
            raise RuntimeError(f"Current rank {self.rank()} is not included in the provided ranks list")
        self.split_comm(None, {})

    def split_group(self, ranks: list[int], timeout: Any = None, opts: Any = None, group_name: str = "",
                    group_desc: str = "", device_types: Any = None) -> SimProcessGroup | None:
        """torch.distributed.split_group's backend half: every parent rank calls it."""
        bad = [r for r in ranks if not 0 <= r < self.size()]
        if bad and self._defects.on("split_refusal_anonymous"):
            raise ValueError("simulator: invalid split")
        if bad and not self._defects.on("split_out_of_range_hang"):
            raise ValueError(
                f"rank {self.my_global_rank}: split_group: ranks {bad} are outside the parent group "
                f"of size {self.size()} (valid group ranks are 0..{self.size() - 1})"
            )
        member = self.rank() in ranks
        if not member and self._defects.on("split_nonmember_raises"):
            raise RuntimeError(f"Current rank {self.rank()} is not included in the provided ranks list")
        options = self._child_options(opts)
        config = self._child_config(options, opts)
        # in the caller's order: torch >= 2.14 keeps it (v2.15.0 distributed_c10d.py:6815), 2.13 sorts first
        members = [self._global_ranks[r] if r < self.size() else 10**6 + r for r in ranks]
        if self._defects.on("split_ranks_as_global"):
            members = list(ranks)
        comm = self.split_comm(members if member else None, config)
        if comm is None:
            return None
        child = SimProcessGroup(
            dist.PrefixStore(f"{group_name}/", self._comm_store), ranks.index(self.rank()), len(ranks),
            members, options, _timeout_s(timeout) if timeout else self._timeout_s,
            comm_store=self._comm_store, prefix=self._prefix, root=self._root, namespace=self._namespace, comm=comm,
            settings=self._settings,
        )
        child.setGroupName(group_name)
        return child

    def _child_options(self, opts: Any) -> SimOptions:
        if self._defects.on("options_aliased") and (opts is None or opts == self._options):
            return self._options
        if self._defects.on("split_drops_options") or opts is None:
            return SimOptions() if self._defects.on("split_drops_options") else copy.deepcopy(self._options)
        if not isinstance(opts, SimOptions):
            raise TypeError(f"simulator: pg_options must be simulator.SimOptions, got {type(opts).__name__}")
        return opts

    def _child_config(self, options: SimOptions, opts: Any) -> dict[str, Any]:
        if self._defects.on("options_aliased") and options is self._options:
            return self.effective_config()
        self._validate(options)
        return self._effective_config(options, comm_name="split")

    def shutdown(self) -> None:
        """Destroy every communicator of this group (the world's rank 0 also releases the world's uid key)."""
        for comm in [self._comm, *self._pair_comms.values()]:
            if comm is not None:
                comm.destroy()
        self._comm = None
        self._pair_comms.clear()
        self._release_namespace()

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
        return SimWork(self._main_comm().launch(op, fn, ops=ops, coalesced=coalesced), outputs=outputs, p2p=p2p,
                       defects=self._defects)

    def _coalesced(self, op: str, run: Callable[[Fabric, slice], Any], count: int, async_op: bool,
                   outputs: list[torch.Tensor] | None = None) -> SimWork | None:
        """One launch, one exchange for a whole coalesced block (``run(fabric, which_ops)``)."""
        if self._defects.on("coalesced_drops_tail"):
            count = min(count, 1)
        if self._defects.on("coalesced_block_cap"):
            count = min(count, 8)
        if self._defects.on("coalesced_per_op_launch"):
            works = [self._launch(op, lambda f, i=i: run(f, slice(i, i + 1)), outputs=outputs) for i in range(count)]
            work = works[-1] if works else None
        else:
            work = self._launch(f"{op}_coalesced", lambda f: run(f, slice(0, count)), ops=count, coalesced=True,
                                outputs=outputs)
        if async_op and self._defects.on("coalesced_async_no_works"):
            return None
        return work

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
        root = 0 if self._defects.on("broadcast_root_zero") else opts.rootRank
        return self._launch("broadcast", lambda f: f.broadcast(tensors, root), outputs=tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        """Reduce to opts.rootRank."""
        op = reduce_op_name(opts.reduceOp)
        return self._launch("reduce", lambda f: f.reduce(tensors, opts.rootRank, op), outputs=tensors)

    def barrier(self, opts: Any = None) -> SimWork:
        """Barrier over the group communicator."""
        if self._defects.on("barrier_no_wait"):
            return self._launch("barrier", lambda f: None)
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
        if self._defects.on("p2p_warn_missing"):
            return
        if self._defects.on("p2p_warn_once_per_process") and any(
                e["message"] == LAZY_P2P_WARNING for e in LOG.events("warning")):
            return
        if not self._warned or self._defects.on("p2p_warn_repeated"):
            self._warned = True
            LOG.warn(LAZY_P2P_WARNING)

    def _p2p_comm(self, peer_group_rank: int) -> tuple[Communicator, int, str]:
        me, peer = self.my_global_rank, self._global_ranks[peer_group_rank]
        pair = (min(me, peer), max(me, peer))
        stream = f"p2p:{pair[0]}-{pair[1]}"
        hidden = self._comm is not None and self._defects.on("p2p_pair_comm_unlogged")
        if self._comm is not None and not self._defects.on("p2p_pair_comm_eager") and not hidden:
            return self._comm, self._comm.local(peer), stream
        if self._comm is None:
            self._warn_lazy_p2p()
        base = f"{self._comm_base()}.p{pair[0]}x{pair[1]}"
        if self._defects.on("p2p_comm_per_op"):
            self._pair_ops[pair] = self._pair_ops.get(pair, 0) + 1
            comm = self._new_comm(f"{base}.{self._pair_ops[pair]}", list(pair), "p2p")
            self._pair_comms[(pair[0], -self._pair_ops[pair])] = comm
        else:
            if pair not in self._pair_comms:
                self._pair_comms[pair] = self._new_comm(base, list(pair), "p2p", recorded=not hidden)
            comm = self._pair_comms[pair]
        return comm, comm.local(peer), stream

    def _p2p(self, op: str, peer: int, fn: Callable[[Fabric, int], Any],
             tensors: list[torch.Tensor] | None = None) -> SimWork | None:
        if (peer == self.rank() or not 0 <= peer < self.size()) and not self._defects.on("p2p_peer_unchecked"):
            what = "destination" if op == "send" else "source"
            raise ValueError(f"rank {self.my_global_rank}: {op}: invalid {what} group rank {peer} "
                             f"(group of size {self.size()}, own rank {self.rank()})")
        faults.maybe_inject(self.my_global_rank, op)
        comm, local_peer, stream = self._p2p_comm(peer)
        if op == "recv":  # posted now, in program order: rendezvous sends wait for this
            comm.fabric.post_receive(local_peer)
        if self._coalescing is not None:
            self._coalescing.append((comm, op, lambda f, lp=local_peer: fn(f, lp)))
            return None
        fut = comm.launch(op, lambda f: fn(f, local_peer), stream=stream)
        return SimWork(fut, source_rank=peer, p2p=True, outputs=tensors, defects=self._defects)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> SimWork | None:
        """Buffered send to group rank dstRank."""
        t = tensors[0]
        return self._p2p("send", dstRank, lambda f, p: f.send(t, p, tag), tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> SimWork | None:
        """Receive from group rank srcRank."""
        t = tensors[0]

        def receive(f: Fabric, peer: int) -> int:
            try:
                f.recv(t, peer, tag)
            except P2PMismatch:
                if not self._defects.on("p2p_mismatch_silent"):
                    raise
            return srcRank

        return self._p2p("recv", srcRank, receive, tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> SimWork:
        """Receive from whichever rank sends first (on a lazy group: on the pair communicator of every peer)."""
        if self._comm is None:
            return self._recv_anysource_lazy(tensors[0], tag)
        comm = self._comm
        comm.fabric.post_receive(None)
        t = tensors[0]
        def any_source(f: Fabric) -> int:
            src = self._global_ranks.index(comm.members[f.recv(t, None, tag)])
            return 0 if self._defects.on("p2p_anysource_wrong_rank") else src

        fut = comm.launch("recv", any_source, stream="p2p:any")
        return SimWork(fut, p2p=True, outputs=tensors, defects=self._defects)

    def _recv_anysource_lazy(self, t: torch.Tensor, tag: int) -> SimWork:
        peers = [p for p in range(self.size()) if p != self.rank()]
        pairs = [self._p2p_comm(p)[:2] for p in peers]
        for comm, _ in pairs:
            comm.fabric.post_receive(None)

        def any_source(_: Fabric) -> int:
            src = peers[recv_any([(comm.fabric.p2p, local) for comm, local in pairs], t, tag)]
            return 0 if self._defects.on("p2p_anysource_wrong_rank") else src

        fut = pairs[0][0].launch("recv", any_source, stream="p2p:any")
        return SimWork(fut, p2p=True, outputs=[t], defects=self._defects)

    def _start_coalescing(self, device: Any) -> None:
        self._coalescing = []

    def _end_coalescing(self, device: Any) -> SimWork:
        """One launch per communicator the block's P2P ops use (the group's, or lazy pair ones),
        sends before receives; every receive was posted when issued, so rendezvous sends complete."""
        ops, self._coalescing = self._coalescing or [], None
        # torch >= 2.14 coalesces batch_isend_irecv for Python groups too (v2.14.1 distributed_c10d.py:3683),
        # so the batch's work is a P2P work and the per-op launch defect applies to it as well
        ordered = [o for o in ops if o[1] == "send"] + [o for o in ops if o[1] == "recv"]
        if self._defects.on("coalesced_per_op_launch"):
            works = [SimWork(comm.launch("p2p", fn), p2p=True, defects=self._defects) for comm, _, fn in ordered]
            return works[-1]
        by_comm: dict[str, tuple[Communicator, list[Callable[[Fabric], Any]]]] = {}
        for comm, _, fn in ordered:
            by_comm.setdefault(comm.id, (comm, []))[1].append(fn)
        if not by_comm or (self._comm is not None and list(by_comm) == [self._comm.id]):
            fns = [fn for _, _, fn in ordered]
            return self._launch("p2p_coalesced", lambda f: [fn(f) for fn in fns], ops=len(ops), coalesced=True,
                                p2p=True)
        futures = [comm.launch("p2p_coalesced", lambda f, fns=fns: [fn(f) for fn in fns], ops=len(fns), coalesced=True)
                   for comm, fns in by_comm.values()]
        every = torch.futures.collect_all(futures).then(lambda done: [f.value() for f in done.value()])
        return SimWork(every, p2p=True, defects=self._defects)  # value() re-raises the first launch error


def effective_config(options: SimOptions, comm_name: str, settings: SimSettings,
                     warn: Callable[[str], None] | None) -> dict[str, Any]:
    """The communicator config for ``options`` on ``settings.path`` (NCCL or torchcomms); unknown hints are
    reported through ``warn`` (None drops them silently)."""
    if settings.path == "torchcomms":
        if settings.defects.on("torchcomms_drops_options"):
            hints: dict[str, str] = {}
        else:
            key = "net_name" if settings.defects.on("hint_net_name_snake") else "netName"
            hints = options_to_hints(options, net_name_key=key)
        return {"hints": parse_hints(hints, comm_name, warn)}
    config = options.as_config()
    config["hints"] = parse_hints(options.hints, comm_name, warn)
    return config


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
        if pg_options is not None and settings.defects.on("init_drops_options"):
            pg_options = None
        prefix, namespace = world_namespace(store, rank)
        root = root_store(store)
        comm_store = dist.PrefixStore(namespace, root) if root is not None else store
        world = SimProcessGroup(store, rank, size, global_ranks, pg_options, timeout_s, comm_store=comm_store,
                                prefix=prefix, root=root, namespace=namespace if root is not None else "",
                                is_world=True, settings=settings)
        world.bound_device_id = bound
        return world
    world = dist.distributed_c10d._get_default_group()
    if not isinstance(world, SimProcessGroup):
        raise RuntimeError("simulator: a 'sim' subgroup needs a 'sim' default group")
    options = pg_options
    if options is not None and world.settings.defects.on("split_drops_options"):
        options = None
    group = SimProcessGroup(store, rank, size, global_ranks, options, timeout_s, comm_store=world._comm_store,
                            prefix=world._prefix, root=world._root, namespace=world._namespace,
                            settings=world.settings)
    group.bound_device_id = bound
    if world.bound_device_id is not None:
        group._comm = world.split_comm(sorted(global_ranks), group.effective_config())
        # torch binds the group it built, then discards it for the Python group a creator returns
        # (torch 2.13 distributed_c10d._new_process_group_helper): carry the binding here instead.
        group.bound_device_id = world.bound_device_id
    return group
