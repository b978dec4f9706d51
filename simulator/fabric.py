"""The simulator's data plane for one communicator on one rank: collectives over shared memory,
composed of three planes with one job each.

- :mod:`simulator.control`: identity, per-thread store connections, the per-op message exchange;
- :mod:`simulator.slots`: the collective slot protocol (where each rank's payload lies in /dev/shm);
- :mod:`simulator.p2p`: P2P envelopes on ordered channels.

Messages are typed records (:mod:`simulator.wire`); tensor bytes travel through shared memory,
except a collective's small payload, which rides inline in its record. This module holds the
collectives themselves: each stages its payload (in this rank's slot, or inline), exchanges one
:class:`~simulator.wire.OpMeta` per rank, checks every rank made the same call, then reads peers'
payloads.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import threading
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from simulator import shm
from simulator.collectives import ListCollectives
from simulator.control import Boot, ControlPlane
from simulator.errors import CollectiveMismatch, SimError
from simulator.p2p import P2PPlane
from simulator.payload import from_text, layout, misfit, nbytes, pack, pack_into, tdesc, to_text, typed
from simulator.reduction import KERNEL, Kernel, dtype_name, reduce_into, unsupported
from simulator.slots import SlotPlane
from simulator.wire import OpMeta, Splits

_SPLIT_BYTES = 4 << 20  # tensors this large are reduced in n chunks, one chunk per rank (measured)
# A payload travels inline in its OpMeta, not through shared memory, when the n ranks' payloads of one op
# add up to at most this: the store then carries at most n * _INLINE_BYTES per op, and a small op needs
# no segment, no mapping and none of the mapping protocol's store round trips.
_INLINE_BYTES = 64 << 10
_INSTANCES = itertools.count()  # makes segment names unique per Fabric within a process


def _chunk(numel: int, n: int, i: int) -> tuple[int, int]:
    return i * numel // n, (i + 1) * numel // n


def _block_bytes(n: int) -> int:
    """Bytes per source and block of a blocked reduction: n source blocks and the result stay in cache."""
    return max(16 << 10, min(256 << 10, (1 << 20) // n))


def _reduce_chunk(out: Tensor, srcs: list[Tensor], own: int, publish: Tensor, op: str, kernel: Kernel) -> None:
    """reduce_into over flat ``out``, block by block, so that the running result stays in cache; each
    reduced block is also copied to ``publish`` (this rank's slot, where peers gather it) while in cache.

    ``srcs[own]`` may be ``out`` itself (the rank's own chunk, reduced in place and never staged): each of
    its blocks is read into a cache-sized scratch block before being overwritten.
    """
    n = len(srcs)
    step = max(1, _block_bytes(n) // out.element_size())
    aliased = srcs[own].data_ptr() == out.data_ptr()
    scratch = torch.empty(min(step, out.numel()), dtype=out.dtype) if aliased else None
    for a in range(0, out.numel(), step):
        b = min(a + step, out.numel())
        blocks = [s[a:b] for s in srcs]
        if scratch is not None:
            blocks[own] = scratch[:b - a].copy_(blocks[own])
        reduce_into(out[a:b], blocks, op, kernel)
        publish[a:b].copy_(out[a:b])


def _split(rows: int, n: int, sizes: list[int] | None, what: str) -> tuple[list[int], str | None]:
    if sizes is None:
        if rows % n:
            return [], f"{what}: dim 0 of size {rows} is not divisible by {n} ranks and no split sizes given"
        return [rows // n] * n, None
    sizes = [int(x) for x in sizes]
    if len(sizes) != n or sum(sizes) != rows or min(sizes) < 0:
        return [], f"{what}: split sizes {sizes} must be {n} non-negative sizes summing to dim 0 ({rows})"
    return sizes, None


@dataclass
class _Op:
    """One collective in flight: its sequence number, every rank's metadata, the payload layout, and the
    payloads that came inline (None for a rank whose payload is in its slot, or who posted none)."""

    name: str
    seq: int
    metas: list[OpMeta]
    offs: list[int]
    inline: list[Tensor | None]


class Fabric(ListCollectives):
    """Blocking data plane of one communicator on one rank.

    Ranks and roots passed to methods are local indices into `members`. Collectives must be issued
    from one thread at a time; send/recv may be used concurrently from threads serving different peers.
    """

    def __init__(self, store: dist.Store, comm_id: str, members: list[int], my_rank: int,
                 timeout_s: float, shm_prefix: str, *, root: dist.Store | None = None,
                 prefixes: tuple[str, ...] = (), kernel: Kernel = KERNEL, p2p: type[P2PPlane] = P2PPlane,
                 boot: Boot | None = None):
        self.kernel = kernel  # the reduction kernel of the backend this communicator belongs to
        self.control = ControlPlane(store, comm_id, members, my_rank, timeout_s, root=root, prefixes=prefixes,
                                    boot=boot)
        self.me, self.n = self.control.me, self.control.n
        self.seq = 0
        comm = re.sub(r"[^A-Za-z0-9_.-]", "_", comm_id)
        if len(comm) > 64:
            comm = f"{comm[:48]}~{zlib.crc32(comm.encode()):08x}"
        stem = f"{shm_prefix}{comm}.r{my_rank}.{os.getpid()}x{next(_INSTANCES)}"
        shm.sweep_dead_once()  # leftovers of processes that died without closing their communicators
        self._coll_lock = threading.Lock()
        self.slots = SlotPlane(self.control, stem)
        self.p2p = p2p(self.control)

    # ----------------------------------------------------------------- helpers
    def _slot(self, op: _Op, j: int) -> Tensor | None:
        inline = op.inline[j]
        return inline if inline is not None else self.slots.slot(op.seq, j, op.metas[j])

    def _view(self, op: _Op, j: int, k: int, like: Tensor) -> Tensor:
        """Flat view of rank j's k-th payload tensor (dtype and size of `like`) for `op`."""
        return typed(self._slot(op, j), op.offs[k], like.dtype, like.numel())

    # --------------------------------------------------------- collective core
    def _begin(self, name: str, desc: str, err: str | None, payload: list[Tensor],
               splits: Splits | None = None, unstaged: dict[int, tuple[int, int]] | None = None) -> _Op:
        """Stage `payload` (in this rank's slot, or inline when small), exchange metadata and check every
        rank agrees. ``unstaged`` maps a payload index to the flat element range this rank reads from the
        tensor itself and peers never read from its slot (pack_into's ``skip``) before this rank publishes
        there; it is staged all the same when the payload goes inline."""
        self.control.check_usable(name)
        self.seq += 1
        seq = self.seq
        offs, total = layout(payload)
        inline = None
        if err is None and total and total * self.n <= _INLINE_BYTES:
            inline = pack(payload, offs, total)
            mine = OpMeta(desc, err, None, 0, splits, inline=to_text(inline))
        else:
            if err is None and total:
                pack_into(self.slots.own_slot(seq, total), payload, offs, unstaged)
            mine = OpMeta(desc, err, self.slots.segment, self.slots.slot_bytes, splits)
        everyone = range(self.n)
        got = self.control.exchange(seq, "meta", mine.encode(), to=everyone, frm=everyone, what=name)
        metas = [mine if j == self.me else OpMeta.decode(got[j]) for j in everyone]
        self.slots.map_peers(seq, metas, name)
        calls = [m.call for m in metas]
        if any(c != calls[0] for c in calls):
            raise CollectiveMismatch(f"{self.control.where(seq)}: ranks issued different collectives: "
                                     + "; ".join(f"rank {self.control.g(j)}: {c}" for j, c in enumerate(calls)))
        errs = [f"rank {self.control.g(j)}: {m.refusal}" for j, m in enumerate(metas) if m.refusal]
        if errs:
            raise SimError(f"{self.control.where(seq)}: {name} rejected: " + "; ".join(errs))
        inlined = [inline if j == self.me else None if m.inline is None else from_text(m.inline)
                   for j, m in enumerate(metas)]
        return _Op(name, seq, metas, offs, inlined)

    def _check_root(self, root: int) -> str | None:
        if not 0 <= root < self.n:
            return f"root {root} is out of range for {self.n} ranks"
        return None

    def _reduce(self, name: str, tensors: list[Tensor], op: str, root: int | None) -> None:
        """all_reduce (root None) or reduce to `root`; large tensors are reduced chunk-per-rank."""
        err = None if root is None else self._check_root(root)
        err = err or next((e for e in (unsupported(t.dtype, op) for t in tensors) if e), None)
        where = "" if root is None else f", root={root}"
        desc = f"{name}({', '.join(map(tdesc, tensors))}, {op}{where})"
        splits = {k: _chunk(t.numel(), self.n, self.me) for k, t in enumerate(tensors)
                  if nbytes(t) >= _SPLIT_BYTES and t.numel() >= self.n}
        # A contiguous tensor's own chunk is read in place rather than staged, unless the list holds its
        # storage twice (its first reduction would then change what the second one reads).
        storages = [t.untyped_storage().data_ptr() for t in tensors]
        unstaged = {k: splits[k] for k in splits if tensors[k].is_contiguous() and storages.count(storages[k]) == 1}
        o = self._begin(name, desc, err, tensors, unstaged=unstaged)
        gets_result = root is None or self.me == root
        chunked = []
        for k, t in enumerate(tensors):
            srcs = [self._view(o, j, k, t) for j in range(self.n)]
            if k not in splits:
                if gets_result:
                    reduce_into(t, [v.view(t.shape) for v in srcs], op, self.kernel)
                continue
            lo, hi = splits[k]
            chunk = [v[lo:hi] for v in srcs]
            if k in unstaged:
                chunk[self.me] = t.view(-1)[lo:hi]
            work = t if gets_result and t.is_contiguous() else None
            target = work.view(-1)[lo:hi] if work is not None else torch.empty(hi - lo, dtype=t.dtype)
            _reduce_chunk(target, chunk, self.me, srcs[self.me][lo:hi], op, self.kernel)
            chunked.append((t, srcs, work))
        if not chunked:
            return
        everyone = range(self.n)
        if root is None:
            self.control.exchange(o.seq, "reduced", "", to=everyone, frm=everyone, what=f"{name} (reduced chunks)")
        else:
            self.control.exchange(o.seq, "reduced", "", to=[root], frm=everyone if gets_result else [],
                                  what=f"{name} (reduced chunks)")
        if not gets_result:
            return
        for t, srcs, work in chunked:
            full = work if work is not None else torch.empty(t.shape, dtype=t.dtype)
            flat = full.view(-1)
            for j in range(self.n):
                if j != self.me or work is None:
                    lo, hi = _chunk(t.numel(), self.n, j)
                    flat[lo:hi].copy_(srcs[j][lo:hi])
            if full is not t:
                t.copy_(full)

    def _own_shard(self) -> int:
        """The shard of a reduce_scatter this rank receives: its own."""
        return self.me

    def _block_offset(self, sends: list[int]) -> int:
        """Where this rank's block starts in a sender's all_to_all_single input, given its split sizes."""
        return sum(sends[:self.me])

    # ------------------------------------------------------------ collectives
    def all_reduce(self, tensors: list[Tensor], op: str) -> None:
        """Reduce `tensors` (coalesced: one exchange for the list) across ranks, in place on every rank."""
        with self._coll_lock:
            self._reduce("all_reduce", tensors, op, None)

    def reduce(self, tensors: list[Tensor], root: int, op: str) -> None:
        """Reduce `tensors` into the root's tensors in place; other ranks' tensors are left unchanged."""
        with self._coll_lock:
            self._reduce("reduce", tensors, op, root)

    def all_gather(self, outputs: list[Tensor], input: Tensor) -> None:
        """outputs[j] := rank j's input, for every member j. The members' inputs may differ in size, as torch
        documents: ProcessGroupNCCL::allgather gathers outputs of one size in one ncclAllGather, and otherwise
        broadcasts each member's input into outputs[j] in turn; every member then names the same output sizes,
        and this rank's own output is the size of its input."""
        err = None
        if len(outputs) != self.n:
            err = f"expected {self.n} output tensors, got {len(outputs)}"
        elif any(o.dtype != input.dtype for o in outputs) or outputs[self.me].shape != input.shape:
            err = (f"output tensors {[tdesc(o) for o in outputs]} must all be {input.dtype}, and output "
                   f"{self.me} (this rank's) {tdesc(input)}")
        even = err is not None or all(o.shape == input.shape for o in outputs)
        desc = f"all_gather({tdesc(input)})" if even else f"all_gather(uneven: {', '.join(map(tdesc, outputs))})"
        with self._coll_lock:
            o = self._begin("all_gather", desc, err, [input])
            for j, out in enumerate(outputs):
                out.copy_(self._view(o, j, 0, out).view(out.shape))

    def all_gather_into_tensor(self, outputs: list[Tensor], inputs: list[Tensor]) -> None:
        """outputs[k] := concatenation along dim 0 of every rank's inputs[k]."""
        err = None
        if len(outputs) != len(inputs):
            err = f"{len(outputs)} outputs for {len(inputs)} inputs"
        else:
            err = next(filter(None, (misfit("output", o, "input", i, self.n)
                                     for o, i in zip(outputs, inputs, strict=True))), None)
        pairs = ", ".join(f"{tdesc(i)}->{tdesc(o)}" for o, i in zip(outputs, inputs, strict=False))
        with self._coll_lock:
            o = self._begin("all_gather_into_tensor", f"all_gather_into_tensor({pairs})", err, inputs)
            for k, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
                full = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype)
                flat, m = full.view(-1), inp.numel()
                for j in range(self.n):
                    flat[j * m:(j + 1) * m].copy_(self._view(o, j, k, inp))
                if full is not out:
                    out.copy_(full)

    def reduce_scatter_tensor(self, outputs: list[Tensor], inputs: list[Tensor], op: str) -> None:
        """outputs[k] := op over ranks of chunk `me` (along dim 0) of inputs[k]."""
        err = None
        if len(outputs) != len(inputs):
            err = f"{len(outputs)} outputs for {len(inputs)} inputs"
        else:
            err = next(filter(None, (misfit("input", i, "output", o, self.n)
                                     for o, i in zip(outputs, inputs, strict=True))), None)
            err = err or next((e for e in (unsupported(t.dtype, op) for t in inputs) if e), None)
        pairs = ", ".join(f"{tdesc(i)}->{tdesc(o)}" for o, i in zip(outputs, inputs, strict=False))
        with self._coll_lock:
            o = self._begin("reduce_scatter_tensor", f"reduce_scatter_tensor({pairs}, {op})", err, inputs)
            shard = self._own_shard()
            for k, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
                m = out.numel()
                srcs = [self._view(o, j, k, inp)[shard * m:(shard + 1) * m].view(out.shape)
                        for j in range(self.n)]
                reduce_into(out, srcs, op, self.kernel)

    def broadcast(self, tensors: list[Tensor], root: int) -> None:
        """Copy the root's tensors into every rank's tensors."""
        desc = f"broadcast({', '.join(map(tdesc, tensors))}, root={root})"
        with self._coll_lock:
            o = self._begin("broadcast", desc, self._check_root(root), tensors if self.me == root else [])
            if self.me != root:
                o.offs = layout(tensors)[0]
                for k, t in enumerate(tensors):
                    t.copy_(self._view(o, root, k, t).view(t.shape))

    def barrier(self) -> None:
        """Return once every member has entered the barrier."""
        with self._coll_lock:
            self._begin("barrier", "barrier()", None, [])

    def all_to_all_single(self, output: Tensor, input: Tensor, output_split_sizes: list[int] | None,
                          input_split_sizes: list[int] | None) -> None:
        """Rank i sends rows input[offset_j : offset_j + input_split_sizes[j]] to rank j (dim 0)."""
        err = None
        if input.dim() == 0 or output.dim() == 0:
            err = "all_to_all_single needs tensors with at least one dimension"
        elif input.dtype != output.dtype or input.shape[1:] != output.shape[1:]:
            err = f"input {tdesc(input)} and output {tdesc(output)} differ beyond dim 0"
        in_sp = out_sp = []
        if err is None:
            in_sp, err = _split(input.shape[0], self.n, input_split_sizes, "input")
        if err is None:
            out_sp, err = _split(output.shape[0], self.n, output_split_sizes, "output")
        trailing = ",".join(["*", *map(str, input.shape[1:])])
        desc = f"all_to_all_single({dtype_name(input.dtype)}[{trailing}])"
        with self._coll_lock:
            o = self._begin("all_to_all_single", desc, err, [input], Splits(in_sp, out_sp))
            sends = [m.splits.sends for m in o.metas]
            bad = [f"rank {self.control.g(i)} sends {sends[i][j]} rows to rank {self.control.g(j)}, which expects "
                   f"{m.splits.expects[i]}" for j, m in enumerate(o.metas) for i in range(self.n)
                   if sends[i][j] != m.splits.expects[i]]
            if bad:
                raise CollectiveMismatch(f"{self.control.where(o.seq)}: all_to_all_single split sizes disagree: "
                                         + "; ".join(bad))
            row = math.prod(input.shape[1:])
            full = output if output.is_contiguous() else torch.empty(output.shape, dtype=output.dtype)
            flat, pos = full.view(-1), 0
            for j in range(self.n):
                count = sends[j][self.me]
                first = self._block_offset(sends[j])
                src = typed(self._slot(o, j), 0, input.dtype, (first + count) * row)[first * row:]
                flat[pos * row:(pos + count) * row].copy_(src)
                pos += count
            if full is not output:
                output.copy_(full)

    # -------------------------------------------------------------------- P2P
    def send(self, tensor: Tensor, dst: int, tag: int) -> None:
        """Send to local rank `dst` (see :meth:`simulator.p2p.P2PPlane.send`)."""
        self.p2p.send(tensor, dst, tag)

    def post_receive(self, src: int | None) -> None:
        """Record, when the application issues it, a receive from local rank `src` (None: any)."""
        self.p2p.post_receive(src)

    def recv(self, tensor: Tensor, src: int | None, tag: int) -> int:
        """Receive the oldest message with `tag` from `src` (any member if None); return its local src."""
        return self.p2p.recv(tensor, src, tag)

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Unlink every segment this rank still owns and drop all mappings.

        Sends not yet received get a grace period of min(timeout_s, 10 s) to be picked up; the
        segments of those still unreceived after it are unlinked (those messages are dropped).
        """
        if self.control.closed:
            return
        self.control.closed = True
        self.p2p.close()
        self.slots.close()
        self.control.close()
