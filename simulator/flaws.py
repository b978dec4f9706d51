"""Planted defects: one flawed override per historical bug the spec guards against.

Each class overrides one or more methods of one part of the simulator (the process group, its creator,
the data plane's fabric or P2P plane, the works, the reduction kernel) with the bug; the reference
classes hold the correct behaviour only. ``simulator.defects.DEFECTS`` names each flaw and the part it
goes into, and ``simulator.defects.resolve`` composes the chosen ones over the reference once, when the
backend is registered. Test machinery: only the defect matrix and the suite's own tests plant them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from simulator.backend import LAZY_P2P_WARNING
from simulator.comm import Communicator, rendezvous
from simulator.config import ConfigError, SimOptions, options_to_hints
from simulator.errors import P2PMismatch, RankTimeout
from simulator.events import LOG

# Each flaw's methods call the part's own through super(); ``Any`` stands for the part it is composed over.
Group = Any


# --- the process group ----------------------------------------------------------------------------
class CoalescedAsyncNoWorks:
    """_coalescing_manager(async_ops=True) returns a work that covers nothing (issue 122807)"""

    def _coalesced(self: Group, op: str, run: Any, count: int, async_op: bool, outputs: Any = None) -> Any:
        work = super()._coalesced(op, run, count, async_op, outputs)
        return None if async_op else work


class CoalescedPerOpLaunch:
    """a coalesced block is launched op by op instead of once"""

    def _coalesced(self: Group, op: str, run: Any, count: int, async_op: bool, outputs: Any = None) -> Any:
        works = [self._launch(op, lambda f, i=i: run(f, slice(i, i + 1)), outputs=outputs) for i in range(count)]
        return works[-1] if works else None

    def _end_coalescing(self: Group, device: Any) -> Any:
        works = [self._parts.p2p_work(comm.launch("p2p", fn)) for comm, _, fn in self._end_block()]
        return works[-1]


class CoalescedDropsTail:
    """a coalesced block runs only its first op; the others are left untouched"""

    def _coalesced(self: Group, op: str, run: Any, count: int, async_op: bool, outputs: Any = None) -> Any:
        return super()._coalesced(op, run, min(count, 1), async_op, outputs)


class CoalescedBlockCap:
    """a coalesced block runs at most 8 ops; the ops after the 8th are left untouched"""

    def _coalesced(self: Group, op: str, run: Any, count: int, async_op: bool, outputs: Any = None) -> Any:
        return super()._coalesced(op, run, min(count, 8), async_op, outputs)


class SplitDropsOptions:
    """options given to split_group/new_group are dropped; the child gets defaults"""

    def _child_options(self: Group, opts: Any) -> SimOptions:
        return SimOptions()


class OptionsAliased:
    """a split child with no options aliases the parent's config instead of copying it"""

    def _child_options(self: Group, opts: Any) -> SimOptions:
        return self._options if opts is None or opts == self._options else super()._child_options(opts)

    def _child_config(self: Group, options: SimOptions, opts: Any) -> dict[str, Any]:
        if options is not self._options:
            return super()._child_config(options, opts)
        return self._comm.config if self._comm is not None else self._config  # the parent's own dict, not a copy


class SplitUnboundAllowed:
    """split_group works on a parent with no bound device"""

    def splits_unbound(self: Group) -> bool:
        return True


class SplitChildUnbound:
    """a split child does not carry the parent's bound device"""

    def _split_child(self: Group, parent: Communicator, child_id: str, members: list[int],
                     config: dict[str, Any]) -> Communicator:
        return self._new_comm(child_id, members, "split", parent=parent.id, device=None, config=config)


class SplitFreshBootstrap:
    """a split child is bootstrapped afresh instead of split from its parent communicator"""

    def _split_child(self: Group, parent: Communicator, child_id: str, members: list[int],
                     config: dict[str, Any]) -> Communicator:
        rendezvous(self._comm_store, f"boot/{child_id}", self.my_global_rank, members, self._timeout_s,
                   f"creating communicator {child_id}")
        return self._new_comm(child_id, members, "eager", device=parent.device, config=config)


def _not_included(rank: int) -> RuntimeError:
    return RuntimeError(f"Current rank {rank} is not included in the provided ranks list")


class SplitNonmemberRaises:
    """a non-member of a partial split raises instead of getting None"""

    def split_group(self: Group, ranks: list[int], *args: Any, **kwargs: Any) -> Any:
        if all(0 <= r < self.size() for r in ranks) and self.rank() not in ranks:
            raise _not_included(self.rank())
        return super().split_group(ranks, *args, **kwargs)

    def perform_nocolor_split(self: Group, device: Any) -> None:
        raise _not_included(self.rank())


class SplitOutOfRangeHang:
    """split_group with a rank outside the parent hangs instead of refusing"""

    def _refuse_outside(self: Group, bad: list[int]) -> None:  # waits for ranks that do not exist
        rendezvous(self._comm_store, f"split-outside/{self._comm_base()}/{self.comm_split_count()}",
                   self.my_global_rank, bad, self._timeout_s, f"split_group (ranks {bad} outside the parent)")


class SplitRefusalAnonymous:
    """split_group refuses ranks outside the parent naming neither the rank nor the size"""

    def _refuse_outside(self: Group, bad: list[int]) -> None:
        raise ValueError("simulator: invalid split")


class SplitRanksAsGlobal:
    """split_group of a subgroup reads the split's group ranks as global ranks"""

    def _split_members(self: Group, ranks: list[int]) -> list[int]:
        return list(ranks)


def _pair_route(group: Group, peer_group_rank: int, recorded: bool) -> tuple[Communicator, int, str]:
    peer = group._global_ranks[peer_group_rank]
    pair = group._pair(group.my_global_rank, peer)
    comm = group._pair_comm(pair, recorded=recorded)
    return comm, comm.local(peer), f"p2p:{pair[0]}-{pair[1]}"


class P2PPairCommEager:
    """send/recv create 2-rank pair communicators even under eager init"""

    def _p2p_comm(self: Group, peer_group_rank: int) -> tuple[Communicator, int, str]:
        if not self.p2p_on_group_comm:
            return super()._p2p_comm(peer_group_rank)
        return _pair_route(self, peer_group_rank, recorded=True)


class P2PPairCommUnlogged:
    """eager P2P runs over 2-rank pair communicators whose creation is never recorded"""

    def _p2p_comm(self: Group, peer_group_rank: int) -> tuple[Communicator, int, str]:
        if not self.p2p_on_group_comm:
            return super()._p2p_comm(peer_group_rank)
        return _pair_route(self, peer_group_rank, recorded=False)


class P2PCommPerOp:
    """lazy P2P creates a new communicator for every op instead of one per pair"""

    def _pair_comm(self: Group, pair: tuple[int, int], recorded: bool = True) -> Communicator:
        uses = self.__dict__.setdefault("_pair_uses", {})
        uses[pair] = n = uses.get(pair, 0) + 1
        comm = self._new_comm(f"{self._comm_base()}.p{pair[0]}x{pair[1]}.{n}", list(pair), "p2p")
        self._pair_comms[(pair[0], -n)] = comm  # destroyed with the group's others at shutdown
        return comm


class P2PWarnMissing:
    """lazy P2P issues no warning recommending a device binding"""

    def _warn_lazy_p2p(self: Group) -> None:
        pass


class P2PWarnRepeated:
    """lazy P2P warns on every op instead of once"""

    def _warn_lazy_p2p(self: Group) -> None:
        self._warned = False
        super()._warn_lazy_p2p()


class P2PWarnOncePerProcess:
    """the lazy-P2P warning is issued once per process, not once per group"""

    def _warn_lazy_p2p(self: Group) -> None:
        if not any(e["message"] == LAZY_P2P_WARNING for e in LOG.events("warning")):
            super()._warn_lazy_p2p()


class P2PAnysourceWrongRank:
    """recv(src=None) reports rank 0 as the source whoever sent"""

    def _source_group_rank(self: Group, comm: Communicator, local: int) -> int:
        return 0


class P2PMismatchSilent:
    """a recv whose size or dtype differs from the send returns as if it succeeded"""

    def _receive(self: Group, fabric: Any, tensor: torch.Tensor, peer: int, tag: int) -> None:
        with contextlib.suppress(P2PMismatch):
            super()._receive(fabric, tensor, peer, tag)


class P2PPeerUnchecked:
    """send/recv do not check the peer; a peer outside the group fails with a bare IndexError"""

    def _refuse_peer(self: Group, op: str, peer: int) -> None:
        pass


class InvalidOptionsAccepted:
    """invalid option values and hint values are accepted silently"""

    def _validate(self: Group, options: SimOptions) -> None:
        with contextlib.suppress(ConfigError):
            super()._validate(options)


class UnknownHintSilent:
    """unknown hint keys are dropped without a warning"""

    def _warn_hint(self: Group, message: str) -> None:
        pass


# CommIdByMembers' communicators of this process, by (world namespace, id): one world's never reach another's.
_BY_MEMBERS: dict[tuple[str, str], Communicator] = {}


class CommIdByMembers:
    """communicator ids derive from member ranks and communicators are kept by id, so every group of the same
    ranks gets the communicator the first of them made (until it is destroyed): none of them is independent

    Sharing one object, rather than making a second communicator under the same id, keeps the symptom the
    same in every run: two live communicators of one id shared store keys and mailboxes, and whether a
    check saw wrong data, an error or nothing depended on which rank read a key first (the defect matrix's
    COLL-* cells flipped between pass and error from run to run).
    """

    def _comm_base(self: Group) -> str:
        return "m" + "_".join(map(str, self._global_ranks))

    def _child_comm_id(self: Group, parent: Communicator, n: int, members: list[int]) -> str:
        return "m" + "_".join(map(str, members))

    def _new_comm(self: Group, comm_id: str, members: list[int], mode: str, **kwargs: Any) -> Communicator:
        key = (self._namespace, comm_id)
        kept = _BY_MEMBERS.get(key)
        if kept is None or kept.fabric is None:  # none yet, or destroyed
            kept = _BY_MEMBERS[key] = super()._new_comm(comm_id, members, mode, **kwargs)
        return kept


class NewgroupOptionsAliased:
    """a group keeps a reference to the caller's options and reads them live"""

    def effective_config(self: Group) -> dict[str, Any]:
        if self._is_world:
            return super().effective_config()
        return self._effective_config(self._options, comm_name=self._name, warn=False)


class LazyCommDefaultConfig:
    """a subgroup's communicator created lazily, at first use, gets the default config"""

    def _lazy_subgroup_config(self: Group) -> dict[str, Any]:
        return self._effective_config(SimOptions(), comm_name=self._comm_base())


class BroadcastRootZero:
    """broadcast copies from group rank 0 whatever the src"""

    def broadcast(self: Group, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._launch("broadcast", lambda f: f.broadcast(tensors, 0), outputs=tensors)


class BroadcastRecordsAutograd:
    """broadcast writes the root's values into the caller's tensor with autograd recording: a parameter that
    requires grad raises"""

    def broadcast(self: Group, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank

        def run(f: Any) -> Any:
            with torch.enable_grad():
                return f.broadcast(tensors, root)
        return self._launch("broadcast", run, outputs=tensors)


class AllreduceDrawsRng:
    """all_reduce draws from torch's global RNG (a random ring order): the user's random stream shifts"""

    def allreduce(self: Group, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        torch.randperm(max(1, self.size()))
        return super().allreduce(tensors, opts)


class HintWarningHidden:
    """the unknown-hint warning is a DeprecationWarning, which Python's default filters hide"""

    def _warn_hint(self: Group, message: str) -> None:
        LOG.warn(message, DeprecationWarning)


class BarrierNoWait:
    """barrier returns at once, without waiting for the other ranks"""

    def barrier(self: Group, opts: Any = None) -> Any:
        return self._launch("barrier", lambda f: None)


class TorchcommsDropsOptions:
    """on the torchcomms path, process-group options never reach CommOptions.hints"""

    def _torchcomms_hints(self: Group, options: SimOptions) -> dict[str, str]:
        return {}


class HintNetNameSnake:
    """net_name is passed as hint 'net_name' instead of 'netName' (torchcomms ignores it)"""

    def _torchcomms_hints(self: Group, options: SimOptions) -> dict[str, str]:
        return options_to_hints(options, net_name_key="net_name")


# --- the creator ----------------------------------------------------------------------------------
class InitDropsOptions:
    """options given to init_process_group never reach the world communicator"""

    def world_options(self, options: Any) -> Any:
        return None


class SubgroupDropsOptions:
    """(the creator's half of split_drops_options)"""

    def subgroup_options(self, options: Any) -> Any:
        return None


class RegisterDevicesNone:
    """the simulator registers without devices, so torch claims cpu and cuda for it"""

    def devices(self) -> list[str] | None:
        return None


class RegisterCorruptsMaps:
    """registering the simulator backend overwrites a device another backend claims"""

    def registered(self, name: str) -> None:
        dist.Backend.default_device_backend_map["cuda"] = name


# --- the data plane -------------------------------------------------------------------------------
class BatchWaitNoWait:  # a P2P work
    """isend/irecv works complete before the data has arrived (pytorch PR 82450)"""

    def wait(self, timeout: Any = None) -> bool:
        return True


class ReduceScatterWrongShard:  # the fabric
    """reduce_scatter_tensor hands each rank the shard of the next rank"""

    def _own_shard(self: Any) -> int:
        return (self.me + 1) % self.n


class AlltoallEvenOffsets:  # the fabric
    """all_to_all_single reads each sender's block at an offset that assumes equal splits"""

    def _block_offset(self: Any, sends: list[int]) -> int:
        return self.me * sends[self.me]


class CollectiveCallsByName:  # the fabric
    """members' collectives are compared by op name only: different roots, dtypes or sizes are not refused"""

    def _begin(self: Any, name: str, desc: str, err: str | None, payload: list[torch.Tensor],
               splits: Any = None, unstaged: Any = None) -> Any:
        return super()._begin(name, name, err, payload, splits, unstaged)


class AllgatherShortListAccepted:  # the fabric
    """all_gather into fewer output tensors than ranks fills those it is given and drops the rest"""

    def all_gather(self: Any, outputs: list[torch.Tensor], input: torch.Tensor) -> None:
        spare = [torch.empty_like(input) for _ in range(self.n - len(outputs))]
        super().all_gather([*outputs, *spare], input)


class AllreduceTimeoutSwallowed:  # the fabric
    """an all_reduce a peer never joins returns the rank's own input when it times out, instead of raising"""

    def all_reduce(self: Any, tensors: list[torch.Tensor], op: str) -> None:
        with contextlib.suppress(RankTimeout):
            super().all_reduce(tensors, op)


class P2PRecvIgnoresSource:  # the P2P plane
    """recv(src=a) takes the oldest pending message from any sender, not from a"""

    def recv(self: Any, tensor: torch.Tensor, src: int | None, tag: int) -> int:
        return super().recv(tensor, None, tag)


# --- the reduction kernel -------------------------------------------------------------------------
class AvgAsSum:
    """ReduceOp.AVG is computed as SUM (the division by the group size is missing)"""

    def average(self, acc: torch.Tensor, count: int) -> None:
        pass


class MinmaxSwapped:
    """ReduceOp.MIN and ReduceOp.MAX are swapped in the reduction kernel"""

    def binary(self, dtype: torch.dtype, op: str) -> Any:
        return super().binary(dtype, {"min": "max", "max": "min"}.get(op, op))


class IntSumViaFloat32:
    """integer SUM/AVG accumulate in float32, losing every bit above 2**24"""

    def accum_dtype(self, dtype: torch.dtype, op: str) -> torch.dtype:
        if op in ("sum", "avg") and dtype == torch.int64:
            return torch.float32
        return super().accum_dtype(dtype, op)


class ComplexProductPartwise:
    """a complex PRODUCT multiplies the real view: real and imaginary parts each multiplied on their own"""

    def binary(self, dtype: torch.dtype, op: str) -> Any:
        if op == "product" and dtype.is_complex:
            return lambda a, b, out: torch.view_as_real(out).copy_(torch.view_as_real(a) * torch.view_as_real(b))
        return super().binary(dtype, op)


class WorkFutureReleasedAtWait:
    """wait() hands the op's outputs over: a future taken from the Work after wait() holds None"""

    def wait(self: Any, timeout: Any = None) -> bool:
        self._handed_over = True
        return super().wait(timeout)

    def get_future(self: Any) -> torch.futures.Future:
        if getattr(self, "_handed_over", False):
            released: torch.futures.Future = torch.futures.Future()
            released.set_result(None)
            return released
        return super().get_future()
