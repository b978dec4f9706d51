"""The simulator's data plane: moves tensor data between rank processes through /dev/shm.

Control messages (per-op metadata, "chunk ready" signals, P2P envelopes) travel through store keys,
using only what every c10d Store has (set, get, multi_get, add, wait, check, delete_key; no queues),
so FileStore, HashStore, TCPStore and PrefixStores over them all work; tensor bytes only ever travel
through shared memory.

Collectives: each rank owns one pooled segment holding two slots; op ``seq`` writes slot
``seq % 2``. A rank finishing op ``s`` has seen every peer's metadata for op ``s``, which peers
post only after finishing op ``s - 1``, so by the time it writes slot ``s % 2`` again (op ``s + 2``)
nobody reads it any more. A segment's name is unlinked as soon as every peer has mapped it (the
last mapper unlinks, counted with ``store.add``), so nothing stays in /dev/shm after an op, and
the memory is freed by the kernel when the last process holding a mapping exits, even on SIGKILL.

P2P: per ordered channel (src, dst) envelope k (tag, dtype, shape, segment) sits under its own key,
read and deleted by the receiver; each message gets its own segment, unlinked by the receiver once
mapped.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import re
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from simulator import connections, rendezvous, shm
from simulator.collectives import ListCollectives
from simulator.defects import NONE, Defects
from simulator.dtypes import dtype_from_name
from simulator.errors import CollectiveMismatch, P2PMismatch, RankTimeout, SimError
from simulator.events import LOG
from simulator.reduction import dtype_name, reduce_into, unsupported

_ALIGN = 64
_PAGE = 4096
_MIN_SLOT = 1 << 16
_SPLIT_BYTES = 4 << 20  # tensors this large are reduced in n chunks, one chunk per rank (measured)
_POLL_MAX_S = 1e-3
_CLOSE_GRACE_S = 10.0
_INSTANCES = itertools.count()  # makes segment names unique per Fabric within a process


def _tdesc(t: Tensor) -> str:
    return f"{dtype_name(t.dtype)}[{','.join(map(str, t.shape))}]"


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _layout(tensors: list[Tensor]) -> tuple[list[int], int]:
    """Offsets of `tensors` packed into one buffer (each aligned), and the total size."""
    offs, pos = [], 0
    for t in tensors:
        offs.append(pos)
        pos += -(-_nbytes(t) // _ALIGN) * _ALIGN
    return offs, pos


def _typed(buf: Tensor | None, off: int, dtype: torch.dtype, numel: int) -> Tensor:
    """A flat `dtype` view of `numel` elements of the uint8 buffer `buf` at byte offset `off`."""
    if numel == 0 or buf is None:
        return torch.empty(0, dtype=dtype)
    size = numel * torch.empty(0, dtype=dtype).element_size()
    return buf[off:off + size].view(dtype)


def _chunk(numel: int, n: int, i: int) -> tuple[int, int]:
    return i * numel // n, (i + 1) * numel // n


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
    """One collective in flight: its sequence number, every rank's metadata and the payload layout."""

    name: str
    seq: int
    metas: list[dict[str, Any]]
    offs: list[int]


class Fabric(ListCollectives):
    """Blocking data plane of one communicator on one rank.

    Ranks and roots passed to methods are local indices into `members`. Collectives must be issued
    from one thread at a time; send/recv may be used concurrently from threads serving different peers.
    """

    def __init__(self, store: dist.Store, comm_id: str, members: list[int], my_rank: int,
                 timeout_s: float, shm_prefix: str, *, root: dist.Store | None = None,
                 prefixes: tuple[str, ...] = (), defects: Defects = NONE):
        if my_rank not in members:
            raise ValueError(f"comm {comm_id}: rank {my_rank} is not a member of {members}")
        self.comm_id = comm_id
        self.members = list(members)
        self.me = self.members.index(my_rank)
        self.n = len(self.members)
        self.timeout_s = timeout_s
        self.defects = defects  # the planted defects of the backend this communicator belongs to
        self.seq = 0
        self._base = store
        self._root, self._prefixes = root, prefixes  # per-thread: `store` rebuilt over a reused connection
        self._tls = threading.local()
        comm = re.sub(r"[^A-Za-z0-9_.-]", "_", comm_id)
        if len(comm) > 64:
            comm = f"{comm[:48]}~{zlib.crc32(comm.encode()):08x}"
        self._stem = f"{shm_prefix}{comm}.r{my_rank}.{os.getpid()}x{next(_INSTANCES)}"
        shm.sweep_dead_once()  # leftovers of processes that died without closing their communicators
        self._coll_lock = threading.Lock()
        self._own: Tensor | None = None
        self._own_name: str | None = None
        self._own_names: list[str] = []
        self._fresh: str | None = None  # own segment created for the op in flight, not yet mapped by peers
        self._slot_bytes = 0
        self._peer: list[tuple[str, Tensor] | None] = [None] * self.n
        self._posted: dict[tuple[str, int], str] = {}
        self._broken: str | None = None
        self._closed = False
        self._p2p_lock = threading.Lock()
        self._sent = [0] * self.n
        self._recvd = [0] * self.n
        self._popped = [0] * self.n
        self._pending: list[list[tuple[int, dict[str, Any]]]] = [[] for _ in range(self.n)]
        self._arrivals = 0
        self._poppers: set[int] = set()
        self._outbox: list[str] = []
        self.rendezvous_bytes = rendezvous.threshold_bytes()

    # ----------------------------------------------------------------- helpers
    def _g(self, local: int) -> int:
        return self.members[local]

    def _st(self) -> dist.Store:
        """This thread's own store connection (a blocking wait must not stall other threads)."""
        if self._root is not None:  # the thread's connection can change: streams hand theirs back when idle
            conn = connections.acquire(self._root)
            if getattr(self._tls, "conn", None) is not conn:
                st = conn
                for prefix in self._prefixes:  # innermost first, as `store` was built
                    st = dist.PrefixStore(prefix, st)
                self._tls.conn, self._tls.store = conn, st
            return self._tls.store
        st = getattr(self._tls, "store", None)
        if st is None:
            try:
                st = self._base.clone()
            except (RuntimeError, AttributeError):
                st = self._base
            self._tls.store = st
        return st

    def _where(self, seq: int | None = None) -> str:
        return f"comm {self.comm_id}" + ("" if seq is None else f" seq {seq}")

    def _check_usable(self, op: str) -> None:
        if self._closed:
            raise SimError(f"{self._where()}: {op} on rank {self._g(self.me)} after close()")
        if self._broken:
            raise SimError(f"{self._where()}: {op} on rank {self._g(self.me)}: communicator is unusable "
                           f"after an earlier failure: {self._broken}")

    # --------------------------------------------------- control-message exchange
    def _exchange(self, seq: int, kind: str, body: str, *, to: Iterable[int], frm: Iterable[int],
                  what: str) -> dict[int, str]:
        """Post `body` for ranks `to`, and collect the (seq, kind) message of every rank in `frm`.

        Only set/wait/multi_get/delete_key, which every c10d Store has: one key per (kind, seq,
        sender). A rank deletes its keys of ops up to seq - 2 when it posts for op seq: every reader of
        such a key read it before posting its own metadata for op seq - 1, which this rank has seen.
        """
        st = self._st()
        if any(j != self.me for j in to):
            key = f"x/{kind}/{seq}/{self.me}"
            st.set(key, body)
            for done in [k for k in self._posted if k[1] <= seq - 2]:
                st.delete_key(self._posted.pop(done))
            self._posted[(kind, seq)] = key
        want = [j for j in frm if j != self.me]
        if not want:
            return {}
        keys = [f"x/{kind}/{seq}/{j}" for j in want]
        try:
            st.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except dist.DistStoreError:
            missing = [self._g(j) for j, k in zip(want, keys, strict=True) if not st.check([k])]
            arrived = sorted({self._g(self.me)} | {self._g(j) for j in want} - set(missing))
            self._broken = (f"{self._where(seq)}: {what} on rank {self._g(self.me)} timed out after "
                            f"{self.timeout_s:g}s waiting for rank(s) {', '.join(map(str, sorted(missing)))} "
                            f"(arrived: {', '.join(map(str, arrived))})")
            raise RankTimeout(self._broken) from None
        return {j: v.decode() for j, v in zip(want, st.multi_get(keys), strict=True)}

    # ------------------------------------------------------------ segments
    def _own_slot(self, seq: int, need: int) -> Tensor:
        """This rank's slot for op `seq`, growing the pooled segment when `need` bytes do not fit."""
        if need > self._slot_bytes:
            slot = -(-max(_MIN_SLOT, need, 2 * self._slot_bytes) // _PAGE) * _PAGE
            name = f"{self._stem}.s{seq}"
            self._own = shm.create(name, 2 * slot)
            self._own_name, self._slot_bytes = name, slot
            self._own_names.append(name)
            if self.n == 1:
                shm.unlink(name)
            else:
                self._fresh = name
        assert self._own is not None
        start = (seq % 2) * self._slot_bytes
        return self._own[start:start + self._slot_bytes]

    def _map_peers(self, seq: int, metas: list[dict[str, Any]], what: str) -> None:
        """Map peers' new segments; the last member to map one unlinks its name and tells the owner.

        The owner of a new segment waits for that signal, so once any rank has finished the op that
        published a segment every member holds a mapping and close() can never pull it from a peer.
        """
        st = self._st()
        for j, meta in enumerate(metas):
            name = meta["g"]
            current = self._peer[j]
            if j == self.me or name is None or (current is not None and current[0] == name):
                continue
            try:
                self._peer[j] = (name, shm.open_segment(name))
            except FileNotFoundError:
                raise SimError(f"{self._where(seq)}: shared-memory segment {name} of rank {self._g(j)} "
                               f"is gone (was it swept?)") from None
            if st.add(f"g/{name}", 1) == self.n - 1:
                shm.unlink(name)
                st.set(f"gok/{name}", "1")
        fresh, self._fresh = self._fresh, None
        if fresh is None:
            return
        try:
            st.wait([f"gok/{fresh}"], datetime.timedelta(seconds=self.timeout_s))
        except dist.DistStoreError:
            mapped = st.add(f"g/{fresh}", 0)
            self._broken = (f"{self._where(seq)}: {what} on rank {self._g(self.me)} timed out after "
                            f"{self.timeout_s:g}s waiting for peers to map segment {fresh} "
                            f"({mapped} of {self.n - 1} did)")
            raise RankTimeout(self._broken) from None
        st.delete_key(f"g/{fresh}")
        st.delete_key(f"gok/{fresh}")

    def _slot(self, op: _Op, j: int) -> Tensor | None:
        meta = op.metas[j]
        base = self._own if j == self.me else (self._peer[j] or (None, None))[1]
        if base is None:
            return None
        start = (op.seq % 2) * meta["b"]
        return base[start:start + meta["b"]]

    def _view(self, op: _Op, j: int, k: int, like: Tensor) -> Tensor:
        """Flat view of rank j's k-th payload tensor (dtype and size of `like`) for `op`."""
        return _typed(self._slot(op, j), op.offs[k], like.dtype, like.numel())

    # --------------------------------------------------------- collective core
    def _begin(self, name: str, desc: str, err: str | None, payload: list[Tensor],
               extra: Any = None) -> _Op:
        """Write `payload` into this rank's slot, exchange metadata and check every rank agrees."""
        self._check_usable(name)
        self.seq += 1
        seq = self.seq
        offs, total = _layout(payload)
        if err is None and total:
            slot = self._own_slot(seq, total)
            for t, off in zip(payload, offs, strict=True):
                _typed(slot, off, t.dtype, t.numel()).view(t.shape).copy_(t)
        meta = {"d": desc, "e": err, "g": self._own_name, "b": self._slot_bytes, "x": extra}
        everyone = range(self.n)
        got = self._exchange(seq, "m", json.dumps(meta), to=everyone, frm=everyone, what=name)
        got[self.me] = json.dumps(meta)
        metas = [json.loads(got[j]) for j in everyone]
        self._map_peers(seq, metas, name)
        descs = [m["d"] for m in metas]
        if any(d != descs[0] for d in descs):
            raise CollectiveMismatch(f"{self._where(seq)}: ranks issued different collectives: "
                                     + "; ".join(f"rank {self._g(j)}: {d}" for j, d in enumerate(descs)))
        errs = [f"rank {self._g(j)}: {m['e']}" for j, m in enumerate(metas) if m["e"]]
        if errs:
            raise SimError(f"{self._where(seq)}: {name} rejected: " + "; ".join(errs))
        return _Op(name, seq, metas, offs)

    def _check_root(self, root: int) -> str | None:
        if not 0 <= root < self.n:
            return f"root {root} is out of range for {self.n} ranks"
        return None

    def _reduce(self, name: str, tensors: list[Tensor], op: str, root: int | None) -> None:
        """all_reduce (root None) or reduce to `root`; large tensors are reduced chunk-per-rank."""
        err = None if root is None else self._check_root(root)
        err = err or next((e for e in (unsupported(t.dtype, op) for t in tensors) if e), None)
        where = "" if root is None else f", root={root}"
        desc = f"{name}({', '.join(map(_tdesc, tensors))}, {op}{where})"
        o = self._begin(name, desc, err, tensors)
        gets_result = root is None or self.me == root
        chunked = []
        for k, t in enumerate(tensors):
            srcs = [self._view(o, j, k, t) for j in range(self.n)]
            if _nbytes(t) < _SPLIT_BYTES or t.numel() < self.n:
                if gets_result:
                    reduce_into(t, [v.view(t.shape) for v in srcs], op, self.defects)
                continue
            lo, hi = _chunk(t.numel(), self.n, self.me)
            work = t if gets_result and t.is_contiguous() else None
            target = work.view(-1)[lo:hi] if work is not None else torch.empty(hi - lo, dtype=t.dtype)
            reduce_into(target, [v[lo:hi] for v in srcs], op, self.defects)
            srcs[self.me][lo:hi].copy_(target)
            chunked.append((t, srcs, work))
        if not chunked:
            return
        everyone = range(self.n)
        if root is None:
            self._exchange(o.seq, "r", "", to=everyone, frm=everyone, what=f"{name} (reduced chunks)")
        else:
            self._exchange(o.seq, "r", "", to=[root], frm=everyone if gets_result else [],
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
        """outputs[j] := rank j's input, for every member j."""
        err = None
        if len(outputs) != self.n:
            err = f"expected {self.n} output tensors, got {len(outputs)}"
        elif any(o.shape != input.shape or o.dtype != input.dtype for o in outputs):
            err = f"output tensors {[_tdesc(o) for o in outputs]} must all be {_tdesc(input)}"
        with self._coll_lock:
            o = self._begin("all_gather", f"all_gather({_tdesc(input)})", err, [input])
            for j, out in enumerate(outputs):
                out.copy_(self._view(o, j, 0, input).view(input.shape))

    def all_gather_into_tensor(self, outputs: list[Tensor], inputs: list[Tensor]) -> None:
        """outputs[k] := concatenation along dim 0 of every rank's inputs[k]."""
        err = None
        if len(outputs) != len(inputs):
            err = f"{len(outputs)} outputs for {len(inputs)} inputs"
        else:
            bad = [(o, i) for o, i in zip(outputs, inputs, strict=True)
                   if o.dtype != i.dtype or o.numel() != self.n * i.numel()]
            if bad:
                err = f"output {_tdesc(bad[0][0])} must hold {self.n} x input {_tdesc(bad[0][1])}"
        pairs = ", ".join(f"{_tdesc(i)}->{_tdesc(o)}" for o, i in zip(outputs, inputs, strict=False))
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
            bad = [(o, i) for o, i in zip(outputs, inputs, strict=True)
                   if o.dtype != i.dtype or i.numel() != self.n * o.numel()]
            if bad:
                err = f"input {_tdesc(bad[0][1])} must hold {self.n} x output {_tdesc(bad[0][0])}"
            err = err or next((e for e in (unsupported(t.dtype, op) for t in inputs) if e), None)
        pairs = ", ".join(f"{_tdesc(i)}->{_tdesc(o)}" for o, i in zip(outputs, inputs, strict=False))
        with self._coll_lock:
            o = self._begin("reduce_scatter_tensor", f"reduce_scatter_tensor({pairs}, {op})", err, inputs)
            shard = (self.me + 1) % self.n if self.defects.on("reduce_scatter_wrong_shard") else self.me
            for k, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
                m = out.numel()
                srcs = [self._view(o, j, k, inp)[shard * m:(shard + 1) * m].view(out.shape)
                        for j in range(self.n)]
                reduce_into(out, srcs, op, self.defects)

    def broadcast(self, tensors: list[Tensor], root: int) -> None:
        """Copy the root's tensors into every rank's tensors."""
        desc = f"broadcast({', '.join(map(_tdesc, tensors))}, root={root})"
        with self._coll_lock:
            o = self._begin("broadcast", desc, self._check_root(root), tensors if self.me == root else [])
            if self.me != root:
                o.offs = _layout(tensors)[0]
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
            err = f"input {_tdesc(input)} and output {_tdesc(output)} differ beyond dim 0"
        in_sp = out_sp = []
        if err is None:
            in_sp, err = _split(input.shape[0], self.n, input_split_sizes, "input")
        if err is None:
            out_sp, err = _split(output.shape[0], self.n, output_split_sizes, "output")
        trailing = ",".join(["*", *map(str, input.shape[1:])])
        desc = f"all_to_all_single({dtype_name(input.dtype)}[{trailing}])"
        with self._coll_lock:
            o = self._begin("all_to_all_single", desc, err, [input], {"i": in_sp, "o": out_sp})
            sends = [m["x"]["i"] for m in o.metas]
            bad = [f"rank {self._g(i)} sends {sends[i][j]} rows to rank {self._g(j)}, which expects "
                   f"{m['x']['o'][i]}" for j, m in enumerate(o.metas) for i in range(self.n)
                   if sends[i][j] != m["x"]["o"][i]]
            if bad:
                raise CollectiveMismatch(f"{self._where(o.seq)}: all_to_all_single split sizes disagree: "
                                         + "; ".join(bad))
            row = math.prod(input.shape[1:])
            full = output if output.is_contiguous() else torch.empty(output.shape, dtype=output.dtype)
            flat, pos = full.view(-1), 0
            for j in range(self.n):
                count = sends[j][self.me]
                first = self.me * count if self.defects.on("alltoall_even_offsets") else sum(sends[j][:self.me])
                src = _typed(self._slot(o, j), 0, input.dtype, (first + count) * row)[first * row:]
                flat[pos * row:(pos + count) * row].copy_(src)
                pos += count
            if full is not output:
                output.copy_(full)

    # -------------------------------------------------------------------- P2P
    def send(self, tensor: Tensor, dst: int, tag: int) -> None:
        """Send: returns once the data sits in shared memory and the envelope is posted, and, for a
        rendezvous-sized message (see simulator.rendezvous), once the receiver has posted its recv."""
        if self._closed:
            raise SimError(f"{self._where()}: send on rank {self._g(self.me)} after close()")
        st = self._st()
        err_key = f"pe/{self.me}>{dst}"
        if st.check([err_key]):  # reported, not raised: refusing this send would hang its matching recv
            report = st.get(err_key).decode()
            st.delete_key(err_key)
            LOG.warn(f"{self._where()}: an earlier send from rank {self._g(self.me)} to rank {self._g(dst)} "
                     f"was rejected by the receiver: {report}", RuntimeWarning)
        with self._p2p_lock:
            k = self._sent[dst]
            self._sent[dst] += 1
            self._outbox = [name for name in self._outbox if shm.exists(name)]
        name = None
        if tensor.numel():
            name = f"{self._stem}.p{self._g(dst)}.{k}"
            buf = shm.create(name, _nbytes(tensor))
            with self._p2p_lock:
                self._outbox.append(name)
            _typed(buf, 0, tensor.dtype, tensor.numel()).view(tensor.shape).copy_(tensor)
        envelope = {"k": k, "tag": tag, "dt": dtype_name(tensor.dtype), "shape": list(tensor.shape),
                    "g": name}
        st.set(f"p/{self.me}>{dst}/{k}", json.dumps(envelope))
        if self.rendezvous_bytes is not None and _nbytes(tensor) >= self.rendezvous_bytes:
            try:
                rendezvous.wait_posted(st, me=self.me, dst=dst, k=k, timeout_s=self.timeout_s,
                                       what=f"send #{k} of {_tdesc(tensor)} (tag {tag})",
                                       names=(f"rank {self._g(self.me)}", f"rank {self._g(dst)}"),
                                       where=self._where())
            except rendezvous.P2PDeadlock as exc:  # hung on NCCL: the communicator is unusable
                self._broken = str(exc)
                raise

    def post_receive(self, src: int | None) -> None:
        """Record, when the application issues it, a receive from local rank `src` (None: any)."""
        if self.rendezvous_bytes is not None:
            rendezvous.post_receive(self._st(), src, self.me)

    def recv(self, tensor: Tensor, src: int | None, tag: int) -> int:
        """Receive the oldest message with `tag` from `src` (any member if None); return its local src."""
        if self._closed:
            raise SimError(f"{self._where()}: recv on rank {self._g(self.me)} after close()")
        if self.defects.on("p2p_recv_ignores_source"):
            src = None
        srcs = list(range(self.n)) if src is None else [src]
        deadline = time.monotonic() + self.timeout_s
        delay = 5e-5
        blocked = False
        try:
            while True:
                hit = self._take(srcs, tag)
                if hit is not None:
                    return self._consume(tensor, hit[0], hit[1], tag)
                if not blocked and self.rendezvous_bytes is not None:  # peers' deadlock reports name it
                    who = "any rank" if src is None else f"rank {self._g(src)}"
                    self._st().set(rendezvous.blocked_key(self.me), f"recv of {_tdesc(tensor)} (tag {tag}) from {who}")
                    blocked = True
                arrived = self._wait_message(srcs, src, tag, deadline, delay)
                delay = 5e-5 if arrived else min(2 * delay, _POLL_MAX_S)
        except RankTimeout:
            blocked = False  # the key stays: the peer's own report names this receive
            raise
        finally:
            if blocked:
                self._st().delete_key(rendezvous.blocked_key(self.me))

    def _wait_message(self, srcs: list[int], src: int | None, tag: int, deadline: float, delay: float) -> bool:
        """Wait (at most until `deadline`) for an envelope from `srcs`; True if one may have arrived."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            who = "any rank" if src is None else f"rank {self._g(src)}"
            nxt = "" if src is None else f" (seq: message #{self._recvd[src]} on that channel)"
            peer = ""
            if src is not None and self.rendezvous_bytes is not None:
                peer = f"; rank {self._g(src)} {rendezvous.peer_state(self._st(), src)}"
            raise RankTimeout(f"{self._where()}: recv(tag={tag}) on rank {self._g(self.me)}: no matching "
                              f"message from {who} within {self.timeout_s:g}s{nxt}{peer}")
        if src is not None and self._claim(src):
            try:
                self._pop(src, remaining)
            finally:
                with self._p2p_lock:
                    self._poppers.discard(src)
            return True
        if any(self._try_pop(j) for j in srcs):
            return True
        time.sleep(min(delay, remaining))
        return False

    def _try_pop(self, src: int) -> bool:
        """Pop channel src -> me without blocking, unless another thread is popping it."""
        if not self._claim(src):
            return False
        try:
            return self._pop(src, None)
        finally:
            with self._p2p_lock:
                self._poppers.discard(src)

    def _claim(self, src: int) -> bool:
        """Become the only thread popping channel src -> me."""
        with self._p2p_lock:
            if src in self._poppers:
                return False
            self._poppers.add(src)
            return True

    def _pop(self, src: int, timeout: float | None) -> bool:
        """Move the next envelope of channel src -> me to the pending list; block up to `timeout` if given.

        The caller has claimed the channel: envelope k of a channel sits under its own key, which only
        this thread reads and deletes.
        """
        st = self._st()
        key = f"p/{src}>{self.me}/{self._popped[src]}"
        if timeout is None:
            if not st.check([key]):
                return False
        else:
            try:
                st.wait([key], datetime.timedelta(seconds=max(timeout, 1e-3)))
            except dist.DistStoreError:
                return False
        raw = st.get(key)
        st.delete_key(key)
        with self._p2p_lock:
            self._popped[src] += 1
            self._pending[src].append((self._arrivals, json.loads(raw)))
            self._arrivals += 1
        return True

    def _take(self, srcs: list[int], tag: int) -> tuple[int, dict[str, Any]] | None:
        """Remove and return the earliest-arrived pending envelope from `srcs` carrying `tag`."""
        with self._p2p_lock:
            best = None
            for j in srcs:
                for pos, (arrival, env) in enumerate(self._pending[j]):
                    if env["tag"] == tag:
                        if best is None or arrival < best[0]:
                            best = (arrival, j, pos)
                        break
            if best is None:
                return None
            _, j, pos = best
            return j, self._pending[j].pop(pos)[1]

    def _consume(self, tensor: Tensor, src: int, env: dict[str, Any], tag: int) -> int:
        with self._p2p_lock:
            self._recvd[src] += 1
        dtype, shape, name = dtype_from_name(env["dt"]), env["shape"], env["g"]
        sent = f"{env['dt']}[{','.join(map(str, shape))}]"
        if dtype != tensor.dtype or math.prod(shape) != tensor.numel():
            if name is not None:
                shm.unlink(name)
            report = (f"{self._where()}: recv(tag={tag}) on rank {self._g(self.me)} matched message "
                      f"#{env['k']} from rank {self._g(src)}: expected {_tdesc(tensor)} (receive buffer), "
                      f"observed {sent} (sent by rank {self._g(src)})")
            self._st().set(f"pe/{src}>{self.me}", report)
            raise P2PMismatch(report)
        if name is not None:
            try:
                buf = shm.open_segment(name)
            except FileNotFoundError:
                raise SimError(f"{self._where()}: recv(tag={tag}) on rank {self._g(self.me)}: message "
                               f"#{env['k']} from rank {self._g(src)} was dropped (sender closed)") from None
            shm.unlink(name)
            tensor.copy_(_typed(buf, 0, dtype, tensor.numel()).view(tensor.shape))
        return src

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Unlink every segment this rank still owns and drop all mappings.

        Sends not yet received get a grace period of min(timeout_s, 10 s) to be picked up; the
        segments of those still unreceived after it are unlinked (those messages are dropped).
        """
        if self._closed:
            return
        self._closed = True
        # a broken communicator (a peer lost, a deadlock reported) will not deliver what it still holds
        deadline = time.monotonic() + (0.0 if self._broken else min(self.timeout_s, _CLOSE_GRACE_S))
        delay = 1e-4
        while True:
            with self._p2p_lock:
                self._outbox = [name for name in self._outbox if shm.exists(name)]
                unreceived = list(self._outbox)
            if not unreceived or time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        for name in [*self._own_names, *unreceived]:
            shm.unlink(name)
        self._own, self._peer = None, [None] * self.n
