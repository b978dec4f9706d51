"""The toyccl process group: collectives and P2P over the c10d store, with communicators it tracks.

Each rank publishes its contribution under ``<op seq>/<rank>`` in the group's store and reads
the others' back; ranks issue ops in the same order, so their sequence numbers agree. P2P
uses a counter per (source, destination, tag), so sends need not line up with collectives,
tags select among messages, and a receive from any source takes the next message announced
to this rank. A receive from a named source is posted at once (irecv returns before its message
exists, as gloo's does) and taken by a thread of its own; one from any source waits for its
message in the call.

Communicators, as a real backend has them: a group's communicator is made lazily on its first
op, or at once when torch binds a device (``eager_connect_single_device``); groups made from a
bound parent (``split_group``, or ``new_group`` once the world is bound) are split from the
parent's communicator; P2P on a group without one makes one 2-rank communicator per pair of
ranks, and warns once per group that a device binding would avoid that. Every communicator
and its config is recorded in ``toyccl.events.LOG``.
"""

from __future__ import annotations

import copy
import functools
import pickle
import threading
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from toyccl.events import LOG
from toyccl.options import ToyOptions

BACKEND_NAME = "toyccl"
LAZY_P2P_WARNING = ("toyccl: send/recv on a group without a device binding creates one communicator per pair of "
                    "ranks; pass device_id to init_process_group to bind a device and reuse the group's")


def _fractional(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _integer_average(ts: list[torch.Tensor]) -> torch.Tensor:
    """An integer sum divided as an integer (NCCL's SumPostDiv): a true division would go through float32."""
    return torch.stack(ts).sum(0).div(len(ts), rounding_mode="trunc")


_REDUCE = {
    dist.ReduceOp.SUM: lambda ts: torch.stack(ts).sum(0),
    dist.ReduceOp.PRODUCT: lambda ts: torch.stack(ts).prod(0),
    dist.ReduceOp.MIN: lambda ts: torch.stack(ts).min(0).values,
    dist.ReduceOp.MAX: lambda ts: torch.stack(ts).max(0).values,
    dist.ReduceOp.AVG: lambda ts: torch.stack(ts).sum(0) / len(ts) if _fractional(ts[0]) else _integer_average(ts),
    dist.ReduceOp.BAND: lambda ts: functools.reduce(torch.bitwise_and, ts),
    dist.ReduceOp.BOR: lambda ts: functools.reduce(torch.bitwise_or, ts),
    dist.ReduceOp.BXOR: lambda ts: functools.reduce(torch.bitwise_xor, ts),
}


class ToyWork(dist.Work):
    """A completed Work whose future holds ``result``; ``source`` is the rank a receive matched."""

    def __init__(self, result: Any = None, source: int = -1) -> None:
        super().__init__()
        self._future: Future = Future()
        self._future.set_result(result)
        self._source = source

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> Future:
        return self._future

    def _source_rank(self) -> int:
        return self._source


class RecvWork(ToyWork):
    """A posted receive (irecv only posts it, as gloo's does): a thread takes the message; ``wait`` joins it and
    raises what it raised, and the future holds the tensors once they arrived."""

    def __init__(self, tensors: list[torch.Tensor], take: Callable[[], int]) -> None:
        dist.Work.__init__(self)
        self._future = Future()
        self._source = -1
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._take, args=(tensors, take), daemon=True)
        self._thread.start()

    def _take(self, tensors: list[torch.Tensor], take: Callable[[], int]) -> None:
        try:
            with torch.no_grad():  # grad mode is per thread: this one writes a parameter below autograd, as c10d does
                self._source = take()
        except BaseException as exc:  # noqa: BLE001 - raised again by wait(), as a real backend's work does
            self._error = exc
            self._future.set_exception(exc)
        else:
            self._future.set_result(tensors)

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._thread.join(None if timeout is None else timeout.total_seconds())
        if self._thread.is_alive():
            raise RuntimeError(f"toyccl: a receive did not complete within {timeout}")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return not self._thread.is_alive()

    def is_success(self) -> bool:
        return not self._thread.is_alive() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error


def completed_work(result: Any = None) -> dist.Work:
    """A Work that is already complete, with ``result`` as its future's value."""
    return ToyWork(result)


def _compact(payload: Any) -> Any:
    """``payload`` with each tensor (alone or in a list) replaced by a copy that owns just its elements."""
    if isinstance(payload, torch.Tensor):
        return payload.clone()  # its own storage, of its elements only (sparse tensors too)
    if isinstance(payload, list):
        return [_compact(p) for p in payload]
    return payload


def _op_name(op: Any) -> str:
    return next((n for n in dir(dist.ReduceOp.RedOpType) if n.isupper() and op == getattr(dist.ReduceOp, n, None)),
                str(op))


def _check_op(rank: int, what: str, op: Any, tensors: list[torch.Tensor]) -> None:
    """Refuse, on every rank and before any exchange, a bitwise reduction of a non-integer tensor."""
    if any(op == bitwise for bitwise in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)):
        for t in tensors:
            if t.dtype.is_floating_point or t.dtype.is_complex:
                raise ValueError(f"toyccl rank {rank}: {what}: ReduceOp.{_op_name(op)} needs an integer or bool "
                                 f"tensor, got {str(t.dtype).removeprefix('torch.')}")


def _reduce(tensors: list[torch.Tensor], op: Any) -> torch.Tensor:
    for known, fn in _REDUCE.items():
        if op == known:
            return fn(tensors)
    raise ValueError(f"toyccl does not support reduce op {_op_name(op)}")


def _options(pg_options: Any) -> ToyOptions:
    if pg_options is None:
        return ToyOptions()
    if not isinstance(pg_options, ToyOptions):
        raise TypeError(f"toyccl: pg_options must be toyccl.ToyOptions, got {type(pg_options).__name__}")
    return pg_options


class ToyProcessGroup(dist.ProcessGroup):
    """A CPU process group that exchanges pickled tensors through a c10d store."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta,
                 global_ranks: list[int] | None = None, options: ToyOptions | None = None, name: str = "") -> None:
        super().__init__(rank, size)
        self._store = store
        self._timeout = timeout
        self._global_ranks = list(global_ranks or range(size))
        self._options = options if options is not None else ToyOptions()
        self._config = self._options.config()
        self._seq = 0
        self._p2p: dict[tuple[int, int, int], int] = {}
        self._taken: set[tuple[int, int, int]] = set()
        self._claims = threading.Lock()  # posted receives run in threads: a message is claimed once
        self._any: dict[int, int] = {}  # per tag: the announcements to this rank read so far
        self._name = name
        self._comm: dict[str, Any] | None = None
        self._pairs: dict[tuple[int, int], str] = {}
        self._warned = False
        self._splits = 0

    # -- names, lifecycle -------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def options(self) -> ToyOptions:
        """The options object this group was made with (torch deep-copies it for split children)."""
        return self._options

    @property
    def supports_splitting(self) -> bool:
        return True

    def _get_backend(self, device: Any) -> ToyProcessGroup:
        # torch >= 2.14 asks every ProcessGroup for its backend in batch_isend_irecv (v2.14.1
        # distributed_c10d.py:3683); a Python group has none registered, so it answers itself.
        return self

    def _set_sequence_number_for_group(self) -> None:
        pass

    def effective_config(self) -> dict[str, Any]:
        """The config of this group's communicator (or the one it will get when made lazily)."""
        return dict(self._comm["config"]) if self._comm else dict(self._config)

    def shutdown(self) -> None:
        self._store = None

    # -- communicators -----------------------------------------------------
    def _make_comm(self, mode: str, members: list[int], *, comm_id: str | None = None, parent: str | None = None,
                   device: str | None = None) -> dict[str, Any]:
        comm = {"comm": comm_id or f"toy:{self._name}", "group": self._name, "members": sorted(members),
                "parent": parent, "mode": mode, "device": device, "config": dict(self._config),
                "backend": BACKEND_NAME}
        LOG.record("comm_created", **comm)
        LOG.record("config_applied", comm=comm["comm"], config=dict(self._config))
        return comm

    def _main_comm(self) -> dict[str, Any]:
        if self._comm is None:
            self._comm = self._make_comm("lazy", self._global_ranks)
        return self._comm

    def eager_connect_single_device(self, device: Any) -> None:
        """Make the group's communicator now (torch calls this when it binds a device)."""
        if self._comm is None:
            self._comm = self._make_comm("eager", self._global_ranks, device=str(device))

    def split_from(self, parent: ToyProcessGroup) -> None:
        """Make this group's communicator by splitting ``parent``'s."""
        pc = parent._main_comm()
        self._comm = self._make_comm("split", self._global_ranks, parent=pc["comm"], device=pc["device"])

    def perform_nocolor_split(self, device: Any) -> None:
        """A non-member's part in a split: toyccl splits need no collective step."""

    def split_group(self, ranks: list[int], timeout: Any = None, opts: Any = None, group_name: str = "",
                    group_desc: str = "", device_types: Any = None) -> ToyProcessGroup | None:
        """torch.distributed.split_group's backend half: every rank of this group calls it."""
        bad = [r for r in ranks if not 0 <= r < self.size()]
        if bad:
            raise ValueError(f"toyccl rank {self._global_ranks[self.rank()]}: split_group: ranks {bad} are outside "
                             f"the parent group of size {self.size()}")
        self._splits += 1  # every rank of this group calls: the count names the child's keys alike everywhere
        if self.rank() not in ranks:
            return None
        options = copy.deepcopy(self._options) if opts is None else _options(opts)
        store = dist.PrefixStore(f"split{self._splits}/{'_'.join(map(str, sorted(ranks)))}/", self._store)
        child = type(self)(store, ranks.index(self.rank()), len(ranks), timeout or self._timeout,
                           [self._global_ranks[r] for r in ranks], options, group_name)
        child.split_from(self)
        return child

    # -- the exchange every collective is built on ------------------------
    def _get(self, key: str) -> Any:
        """The value at ``key``, waiting at most this group's timeout (the store is shared with other groups,
        so its own default timeout is not this group's to set)."""
        self._store.wait([key], self._timeout)
        return pickle.loads(self._store.get(key))

    def _poll(self, key: str) -> Any:
        """``_get`` for a receive's thread: it polls, since a waiting store call would hold the store's client,
        which this process's other ops share, until the key exists."""
        deadline, pause = time.monotonic() + self._timeout.total_seconds(), 0.0005
        while not self._store.check([key]):
            if time.monotonic() > deadline:
                raise dist.DistStoreError(f"toyccl rank {self.rank()}: wait timeout after "
                                          f"{self._timeout.total_seconds() * 1000:.0f}ms, keys: {key}")
            time.sleep(pause)
            pause = min(2 * pause, 0.01)
        return pickle.loads(self._store.get(key))

    def _exchange(self, payload: Any) -> list[Any]:
        """Publish ``payload`` and return every rank's payload, in rank order. Tensors travel as compact copies:
        a pickled view carries its whole storage, so a block of views of one buffer would send the buffer once
        per view (a 257-op block of one 86 KB buffer: 22 MB, past what the TCPStore takes in one value)."""
        self._main_comm()
        self._seq += 1
        self._store.set(f"{self._seq}/{self.rank()}", pickle.dumps(_compact(payload)))
        return [self._get(f"{self._seq}/{r}") for r in range(self.size())]

    def _check_splits(self, sizes: list[int], rows: int, side: str) -> list[int]:
        """``sizes`` (or equal splits when empty) as all_to_all_single needs them: one per rank, summing to dim 0."""
        n = self.size()
        if not sizes:
            sizes = [rows // n] * n
        if len(sizes) != n or sum(sizes) != rows:
            raise ValueError(f"toyccl rank {self.rank()}: all_to_all_single: {side} split sizes {list(sizes)} must "
                             f"be {n} sizes (the group size) summing to dim 0 ({rows})")
        return list(sizes)

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
        _check_op(self.rank(), "all_reduce", op, tensors)
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            t.copy_(_reduce([contrib[i] for contrib in everyone], op))

    # -- collectives --------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        self._allreduce_list(tensors, opts.reduceOp if opts else dist.ReduceOp.SUM)
        return completed_work(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        self._allreduce_list(tensors, opts.reduceOp if opts else dist.ReduceOp.SUM)
        return completed_work(tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        for out_list in outputs:
            if len(out_list) != self.size():
                raise ValueError(f"toyccl rank {self.rank()}: all_gather: expected {self.size()} output tensors "
                                 f"(the group size), got {len(out_list)}")
        everyone = self._exchange([t.detach().cpu() for t in inputs])
        for i, out_list in enumerate(outputs):
            for r, out in enumerate(out_list):
                out.copy_(everyone[r][i])
        return completed_work(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        everyone = self._exchange(input.detach().cpu())
        output.copy_(torch.cat([t.reshape(-1) for t in everyone]).reshape(output.shape))
        return completed_work([output])  # a future holds the list of outputs, as NCCL's and gloo's do

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        everyone = self._exchange([t.detach().cpu() for t in inputs])
        for i, out in enumerate(outputs):
            out.copy_(torch.cat([contrib[i].reshape(-1) for contrib in everyone]).reshape(out.shape))
        return completed_work(outputs)

    def _scatter_reduced(self, output: torch.Tensor, full: torch.Tensor) -> None:
        if full.numel() != self.size() * output.numel():  # every rank refuses alike: the exchange is done
            raise ValueError(f"toyccl rank {self.rank()}: reduce_scatter: input {list(full.shape)} must hold "
                             f"{self.size()} x output {list(output.shape)}")
        chunk = full.reshape(self.size(), -1)[self.rank()]
        output.copy_(chunk.reshape(output.shape))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        _check_op(self.rank(), "reduce_scatter", opts.reduceOp, [input])
        everyone = self._exchange(input.detach().cpu())
        self._scatter_reduced(output, _reduce(everyone, opts.reduceOp))
        return completed_work([output])  # a future holds the list of outputs, as NCCL's and gloo's do

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        _check_op(self.rank(), "reduce_scatter", opts.reduceOp, inputs)
        everyone = self._exchange([t.detach().cpu() for t in inputs])
        for i, out in enumerate(outputs):
            self._scatter_reduced(out, _reduce([contrib[i] for contrib in everyone], opts.reduceOp))
        return completed_work(outputs)

    # torch 2.11 calls these names for all_gather_into_tensor, reduce_scatter_tensor and their coalesced
    # blocks (v2.11.0 distributed_c10d.py:4186, :4652, :2766, :2776); 2.13 and later call the ones above
    # (v2.13.0 :4387, :4936, :2909, :2919).
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _check_root(self, op: str, root: int) -> None:
        """torch passes a root named by group rank unchecked: refuse one outside the group before any exchange."""
        if not 0 <= root < self.size():
            raise ValueError(f"toyccl rank {self.rank()}: {op}: invalid root {root} (group size {self.size()})")

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        self._check_root("broadcast", opts.rootRank)
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            t.copy_(everyone[opts.rootRank][i])
        return completed_work(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        self._check_root("reduce", opts.rootRank)
        _check_op(self.rank(), "reduce", opts.reduceOp, tensors)
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        if self.rank() == opts.rootRank:
            for i, t in enumerate(tensors):
                t.copy_(_reduce([contrib[i] for contrib in everyone], opts.reduceOp))
        return completed_work(tensors)

    def _check_rows(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """all_to_all_single moves rows along dim 0: both tensors need one, with rows of one shape and dtype."""
        def desc(t: torch.Tensor) -> str:
            return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
        if input.dim() == 0 or output.dim() == 0:
            raise ValueError(f"toyccl rank {self.rank()}: all_to_all_single: input {desc(input)} and output "
                             f"{desc(output)}: both need at least one dimension (dim 0 holds the rows)")
        if input.dtype != output.dtype or input.shape[1:] != output.shape[1:]:
            raise ValueError(f"toyccl rank {self.rank()}: all_to_all_single: input {desc(input)} and output "
                             f"{desc(output)} differ beyond dim 0 (the dtype and shape of a row)")

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> dist.Work:
        self._check_rows(output, input)
        sizes = self._check_splits(input_split_sizes, input.shape[0], "input")
        self._check_splits(output_split_sizes, output.shape[0], "output")
        everyone = self._exchange((input.detach().cpu(), sizes))
        pieces = []
        for data, their_sizes in everyone:
            start = sum(their_sizes[: self.rank()])
            pieces.append(data[start:start + their_sizes[self.rank()]])
        output.copy_(torch.cat(pieces).reshape(output.shape))
        return completed_work([output])  # a future holds the list of outputs, as NCCL's and gloo's do

    def barrier(self, opts: Any = None) -> dist.Work:
        self._exchange(None)
        return completed_work()

    # -- point to point -------------------------------------------------------
    def _check_peer(self, op: str, peer: int) -> None:
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"toyccl rank {self.rank()}: {op}: invalid peer {peer} (group size {self.size()})")

    def _pair_comm(self, peer: int) -> None:
        """Under lazy init, P2P with ``peer`` runs on a 2-rank communicator made on first use."""
        if self._comm is not None:
            return
        if not self._warned:
            self._warned = True
            warnings.warn(LAZY_P2P_WARNING, UserWarning, stacklevel=3)
        me, other = self._global_ranks[self.rank()], self._global_ranks[peer]
        pair = (min(me, other), max(me, other))
        if pair not in self._pairs:
            self._pairs[pair] = self._make_comm("p2p", list(pair), comm_id=f"toy:{self._name}.p{pair[0]}x{pair[1]}")[
                "comm"]

    def _next(self, src: int, dst: int, tag: int) -> int:
        with self._claims:
            n = self._p2p.get((src, dst, tag), 0) + 1
            while (src, tag, n) in self._taken:
                n += 1
            self._p2p[(src, dst, tag)] = n
            return n

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        self._check_peer("send", dst)
        self._pair_comm(dst)
        n = self._next(self.rank(), dst, tag)
        payload = _compact([t.detach().cpu() for t in tensors])
        self._store.set(f"p2p/{self.rank()}->{dst}/t{tag}/{n}", pickle.dumps(payload))
        slot = self._store.add(f"any/{dst}/t{tag}", 1)
        self._store.set(f"any/{dst}/t{tag}/{slot}", pickle.dumps((self.rank(), n)))
        return completed_work(tensors)

    def _deliver(self, tensors: list[torch.Tensor], src: int, tag: int, n: int, posted: bool = False) -> None:
        key = f"p2p/{src}->{self.rank()}/t{tag}/{n}"
        received = self._poll(key) if posted else self._get(key)
        for t, r in zip(tensors, received, strict=True):
            if t.shape != r.shape or t.dtype != r.dtype:
                raise ValueError(f"toyccl rank {self.rank()}: recv from rank {src}: expected {r.dtype}{list(r.shape)} "
                                 f"as sent, but the receive buffer is {t.dtype}{list(t.shape)}")
            t.copy_(r)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        """Post a receive: its message number is taken now, in posting order; the message in a thread."""
        self._check_peer("recv", src)
        self._pair_comm(src)
        n = self._next(src, self.rank(), tag)

        def take() -> int:
            self._deliver(tensors, src, tag, n, posted=True)
            return src

        return RecvWork(tensors, take)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        """Receive the next message announced to this rank with ``tag``, from whichever rank sent it (at once: its
        sender, and so its pair communicator, is known only once it matched)."""
        while True:
            self._any[tag] = self._any.get(tag, 0) + 1
            src, n = self._get(f"any/{self.rank()}/t{tag}/{self._any[tag]}")
            with self._claims:
                if (src, tag, n) not in self._taken and n > self._p2p.get((src, self.rank(), tag), 0):
                    self._taken.add((src, tag, n))
                    break
        self._pair_comm(src)
        self._deliver(tensors, src, tag, n)
        return ToyWork(tensors, src)


def register(name: str = BACKEND_NAME, cls: type[ToyProcessGroup] = ToyProcessGroup) -> None:
    """Register ``cls`` with torch.distributed as backend ``name`` (CPU, extended API)."""

    def create(common: Any, pg_options: Any) -> ToyProcessGroup:
        group = cls(common.store, common.group_rank, common.group_size, common.timeout,
                    list(common.global_ranks_in_group) or None, _options(pg_options), common.group_id)
        # torch >= 2.14 passes the group it built (already bound when device_id was given) and then
        # uses the group returned here instead: keep its binding (v2.15.0 distributed_c10d.py:3118)
        replaced = getattr(common, "process_group", None)
        group.bound_device_id = replaced.bound_device_id if replaced is not None else None
        world = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
        if isinstance(world, ToyProcessGroup) and world.bound_device_id is not None:
            group.split_from(world)
            group.bound_device_id = world.bound_device_id
        return group

    dist.Backend.register_backend(name, create, extended_api=True, devices=["cpu"])
