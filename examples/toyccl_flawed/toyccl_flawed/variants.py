"""Flawed variants of toyccl, one realistic bug each, each registered under its own backend name.

Import this module (``--import toyccl_flawed.variants``) and certify a variant by its name, e.g.
``conformance certify --backend toyccl_avg_sum --device cpu --import toyccl_flawed.variants``.
``VARIANTS`` maps each name to its bug and to the requirement that must fail on it.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
import torch.distributed as dist
from toyccl import conformance_probe  # toyccl's record of its communicators, which the variants share
from toyccl.backend import LAZY_P2P_WARNING, ToyProcessGroup, _reduce, completed_work, register


class _Named(ToyProcessGroup):
    backend_name = ""

    def getBackendName(self) -> str:
        return self.backend_name


class AvgAsSum(_Named):
    """AVG is reduced as SUM (the division by the group size is missing), on every path."""

    backend_name = "toyccl_avg_sum"

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        super()._allreduce_list(tensors, dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op)


class MinMaxSwapped(_Named):
    """MIN and MAX are swapped, on every path."""

    backend_name = "toyccl_minmax_swapped"

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        if op == dist.ReduceOp.MIN:
            op = dist.ReduceOp.MAX
        elif op == dist.ReduceOp.MAX:
            op = dist.ReduceOp.MIN
        super()._allreduce_list(tensors, op)


class WrongShard(_Named):
    """reduce_scatter hands each rank the shard of the next rank."""

    backend_name = "toyccl_wrong_shard"

    def _scatter_reduced(self, output: torch.Tensor, full: torch.Tensor) -> None:
        chunk = full.reshape(self.size(), -1)[(self.rank() + 1) % self.size()]
        output.copy_(chunk.reshape(output.shape))


class BroadcastFromZero(_Named):
    """broadcast copies from group rank 0 whatever the root."""

    backend_name = "toyccl_bcast_root0"

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            t.copy_(everyone[0][i])
        return completed_work(tensors)


class BarrierNoWait(_Named):
    """barrier returns at once (its exchange is skipped)."""

    backend_name = "toyccl_barrier_nowait"

    def barrier(self, opts: Any = None) -> dist.Work:
        return completed_work()


class NarrowIntSum(_Named):
    """Integer all_reduce accumulates in float32, losing every bit above 2**24."""

    backend_name = "toyccl_narrow_int"

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            column = [contrib[i] for contrib in everyone]
            if not t.dtype.is_floating_point and t.dtype != torch.bool and op == dist.ReduceOp.SUM:
                t.copy_(torch.stack([c.float() for c in column]).sum(0).to(t.dtype))
            else:
                t.copy_(_reduce(column, op))


class SplitRangeAtSizeOnly(_Named):
    """split_group refuses a split rank equal to the group size but lets one above it through (its bound test
    is written ``r != size``): members then fail with a bare IndexError, non-members get None."""

    backend_name = "toyccl_split_range"

    def split_group(self, ranks: list[int], timeout: Any = None, opts: Any = None, group_name: str = "",
                    group_desc: str = "", device_types: Any = None) -> ToyProcessGroup | None:
        bad = [r for r in ranks if not 0 <= r != self.size()]  # the flaw: toyccl's is `0 <= r < self.size()`
        if bad:
            raise ValueError(f"toyccl rank {self.rank()}: split_group: ranks {bad} are outside the parent group")
        self._splits += 1
        if self.rank() not in ranks:
            return None
        options = copy.deepcopy(self._options) if opts is None else opts
        store = dist.PrefixStore(f"split{self._splits}/{'_'.join(map(str, sorted(ranks)))}/", self._store)
        child = type(self)(store, ranks.index(self.rank()), len(ranks), timeout or self._timeout,
                           [self._global_ranks[r] for r in ranks], options, group_name)
        child.split_from(self)
        return child


class NoPairComms(_Named):
    """Lazy P2P warns that it makes a communicator per pair, but makes none (its traffic does not need them)."""

    backend_name = "toyccl_no_pair_comms"

    def _pair_comm(self, peer: int) -> None:
        if self._comm is None and not self._warned:
            self._warned = True
            warnings.warn(LAZY_P2P_WARNING, UserWarning, stacklevel=3)


class SeqCheckedWithIs(_Named):
    """Each message carries its number on its channel, and the receiver checks it with ``is not`` instead of
    ``!=``: equal numbers are one object only within CPython's small-int cache, so message 257 of a channel
    is refused as out of order."""

    backend_name = "toyccl_seq_is"

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        self._sent_seq = getattr(self, "_sent_seq", {})
        seq = self._sent_seq[(dst, tag)] = self._sent_seq.get((dst, tag), 0) + 1
        self._store.set(f"seq/{self.rank()}->{dst}/t{tag}/{seq}", str(seq))
        return super().send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        self._recv_seq = getattr(self, "_recv_seq", {})
        want = self._recv_seq[(src, tag)] = self._recv_seq.get((src, tag), 0) + 1
        got = int(self._get_raw(f"seq/{src}->{self.rank()}/t{tag}/{want}"))
        if got is not want:
            raise RuntimeError(f"toyccl rank {self.rank()}: message {got} from rank {src} out of order "
                               f"(expected {want})")
        return super().recv(tensors, src, tag)

    def _get_raw(self, key: str) -> bytes:
        self._store.wait([key], self._timeout)
        return self._store.get(key)


class BlockingIrecv(_Named):
    """irecv waits for its message before it returns (a receive written synchronously), so a batch_isend_irecv
    that lists a receive before the send its peer waits for never completes."""

    backend_name = "toyccl_blocking_irecv"

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        work = super().recv(tensors, src, tag)
        work.wait()
        return work


VARIANTS: dict[str, tuple[type[ToyProcessGroup], str, str]] = {
    cls.backend_name: (cls, (cls.__doc__ or "").strip(), requirement)
    for cls, requirement in ((AvgAsSum, "COLL-ALLREDUCE-OPS"), (MinMaxSwapped, "COLL-ALLREDUCE-OPS"),
                             (WrongShard, "COLL-GATHER-SCATTER-ORDER"), (BroadcastFromZero, "COLL-ROOTED"),
                             (BarrierNoWait, "COLL-BARRIER-BLOCKS"), (NarrowIntSum, "COLL-ALLREDUCE-OPS"),
                             (SplitRangeAtSizeOnly, "SPLIT-VALIDATION"), (NoPairComms, "P2P-LAZY-PAIR-COMM"),
                             (SeqCheckedWithIs, "P2P-DATA"), (BlockingIrecv, "COAL-BATCH-WAIT"))
}
# What a variant must declare for its requirement to judge it (toyccl's own declarations that matter there).
DECLARES: dict[str, str] = {
    SplitRangeAtSizeOnly.backend_name: "device_binding,split",
    NoPairComms.backend_name: "lazy_pair_comms",
}

for _name, (_cls, _bug, _req) in VARIANTS.items():
    register(_name, _cls)

__all__ = ["DECLARES", "VARIANTS", "conformance_probe"]
