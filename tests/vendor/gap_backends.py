"""Flawed toyccl variants whose one bug lives outside the hand-picked cases the checks had before the generated
ones: above a size, at values, in a layout, dtype, op, root, tag or block length no check used. Test machinery
only (tests/vendor/test_gap_backends.py); importing this module registers every variant under its name.

Each entry of ``GAPS`` is ``name: (class, requirement that must fail)``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from toyccl.backend import ToyProcessGroup, ToyWork, _reduce, completed_work, register

BIG_BYTES = 64 * 1024


class _Named(ToyProcessGroup):
    backend_name = ""

    def getBackendName(self) -> str:
        return self.backend_name


class BigAllreduceTail(_Named):
    """all_reduce of a tensor above 64 KiB leaves its last element unreduced (a chunking off-by-one)."""

    backend_name = "gap_big_tail"

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        mine = [t.detach().cpu().clone() for t in tensors]
        super()._allreduce_list(tensors, op)
        for t, own in zip(tensors, mine):
            if t.numel() * t.element_size() > BIG_BYTES:
                t.view(-1)[-1] = own.view(-1)[-1]


class Uint8AsInt8(_Named):
    """uint8 reductions run through int8: MIN and MAX of values above 127 compare as negatives."""

    backend_name = "gap_uint8_signed"

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            column = [contrib[i] for contrib in everyone]
            smallest, largest = op == dist.ReduceOp.MIN, op == dist.ReduceOp.MAX  # (`in` misses a ReduceOp)
            if t.dtype == torch.uint8 and (smallest or largest):
                signed = torch.stack([c.view(torch.int8) for c in column])
                t.copy_((signed.amin(0) if smallest else signed.amax(0)).view(torch.uint8))
            else:
                t.copy_(_reduce(column, op))


class GatherIgnoresOffset(_Named):
    """all_gather_into_tensor writes its output from the start of the storage, ignoring the view's offset."""

    backend_name = "gap_gather_offset"

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        everyone = self._exchange(input.detach().cpu())
        target = torch.as_strided(output, output.shape, output.stride(), 0)
        target.copy_(torch.cat([t.reshape(-1) for t in everyone]).reshape(output.shape))
        return completed_work(output)


class BigBroadcastFromZero(_Named):
    """broadcast above 4 KiB (a "tree" path) sends group rank 0's data whatever the root."""

    backend_name = "gap_bcast_big_root"

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            root = 0 if t.numel() * t.element_size() > 4096 else opts.rootRank
            t.copy_(everyone[root][i])
        return completed_work(tensors)


class ReduceOnlySumMax(_Named):
    """reduce (to a root) applies SUM for every op but MAX."""

    backend_name = "gap_reduce_op"

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        op = opts.reduceOp if opts.reduceOp == dist.ReduceOp.MAX else dist.ReduceOp.SUM
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        if self.rank() == opts.rootRank:
            for i, t in enumerate(tensors):
                t.copy_(_reduce([contrib[i] for contrib in everyone], op))
        return completed_work(tensors)


class AnySourceTagAsSource(_Named):
    """recv(src=None) with a non-zero tag reports the tag (modulo the group size) as the source."""

    backend_name = "gap_anysource_tag"

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        work = super().recv_anysource(tensors, tag)
        return ToyWork(tensors, tag % self.size()) if tag else work


class EmptySendCrashes(_Named):
    """send reads the first element of the tensor as a header: an empty tensor raises IndexError."""

    backend_name = "gap_empty_send"

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        _header = tensors[0].reshape(-1)[0]
        return super().send(tensors, dst, tag)


class Int64ThroughDouble(_Named):
    """int64 SUM accumulates in float64, losing every bit above 2**53."""

    backend_name = "gap_int64_double"

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            column = [contrib[i] for contrib in everyone]
            if t.dtype == torch.int64 and op == dist.ReduceOp.SUM:
                t.copy_(torch.stack([c.double() for c in column]).sum(0).to(torch.int64))
            else:
                t.copy_(_reduce(column, op))


class NDFirstRow(_Named):
    """all_reduce of a tensor with 3 or more dimensions reduces only its first slice t[0]."""

    backend_name = "gap_nd_first_row"

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            reduced = _reduce([contrib[i] for contrib in everyone], op)
            if t.dim() >= 3 and t.shape[0] > 0:
                t[0].copy_(reduced[0])
            else:
                t.copy_(reduced)


class CoalescedFirst64(_Named):
    """A coalesced all_reduce block reduces its first 64 tensors only; the rest keep this rank's input."""

    backend_name = "gap_coalesced_64"

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        self._allreduce_list(tensors[:64], opts.reduceOp if opts else dist.ReduceOp.SUM)
        return completed_work(tensors)


class Bf16ThroughHalf(_Named):
    """bfloat16 all_reduce SUM accumulates in float16: sums above 65504 become inf."""

    backend_name = "gap_bf16_half"

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            column = [contrib[i] for contrib in everyone]
            if t.dtype == torch.bfloat16 and op == dist.ReduceOp.SUM:
                t.copy_(torch.stack([c.half() for c in column]).sum(0).to(torch.bfloat16))
            else:
                t.copy_(_reduce(column, op))


GAPS: dict[str, tuple[type[ToyProcessGroup], str]] = {
    cls.backend_name: (cls, requirement) for cls, requirement in (
        (BigAllreduceTail, "COLL-ALLREDUCE-OPS"), (Uint8AsInt8, "COLL-ALLREDUCE-OPS"),
        (GatherIgnoresOffset, "COLL-GATHER-SCATTER-ORDER"), (BigBroadcastFromZero, "COLL-ROOTED"),
        (ReduceOnlySumMax, "COLL-ROOTED"), (AnySourceTagAsSource, "P2P-DATA"), (EmptySendCrashes, "P2P-DATA"),
        (Int64ThroughDouble, "COLL-ALLREDUCE-OPS"), (NDFirstRow, "COLL-ALLREDUCE-OPS"),
        (CoalescedFirst64, "COAL-SYNC-RESULTS"), (Bf16ThroughHalf, "COLL-ALLREDUCE-OPS"))}

for _name, (_cls, _req) in GAPS.items():
    register(_name, _cls)
