"""The toyccl process group: collectives and P2P over the c10d store.

Each rank publishes its contribution under ``<op seq>/<rank>`` in the group's store and
reads the others' back; ranks issue ops in the same order, so their sequence numbers agree.
P2P uses a per-pair counter instead, so sends need not line up with collectives.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

BACKEND_NAME = "toyccl"

_REDUCE = {
    dist.ReduceOp.SUM: lambda ts: torch.stack(ts).sum(0),
    dist.ReduceOp.PRODUCT: lambda ts: torch.stack(ts).prod(0),
    dist.ReduceOp.MIN: lambda ts: torch.stack(ts).min(0).values,
    dist.ReduceOp.MAX: lambda ts: torch.stack(ts).max(0).values,
    dist.ReduceOp.AVG: lambda ts: torch.stack(ts).sum(0) / len(ts),
}


def completed_work(result: Any = None) -> dist.Work:
    """A Work that is already complete, with ``result`` as its future's value."""
    fut: Future = Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


def _reduce(tensors: list[torch.Tensor], op: Any) -> torch.Tensor:
    for known, fn in _REDUCE.items():
        if op == known:
            return fn(tensors)
    raise ValueError(f"toyccl does not support reduce op {op}")


class ToyProcessGroup(dist.ProcessGroup):
    """A CPU process group that exchanges pickled tensors through a c10d store."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._store = store
        self._store.set_timeout(timeout)
        self._seq = 0
        self._p2p: dict[tuple[int, int], int] = {}
        self._name = ""

    # -- names, lifecycle -------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def _get_backend(self, device: Any) -> ToyProcessGroup:
        # torch >= 2.14 asks every ProcessGroup for its backend in batch_isend_irecv (v2.14.1
        # distributed_c10d.py:3683); a Python group has none registered, so it answers itself.
        # Without supports_coalescing, torch then issues the batch as separate isend/irecv.
        return self

    def shutdown(self) -> None:
        self._store = None

    # -- the exchange every collective is built on ------------------------
    def _exchange(self, payload: Any) -> list[Any]:
        """Publish ``payload`` and return every rank's payload, in rank order."""
        self._seq += 1
        self._store.set(f"{self._seq}/{self.rank()}", pickle.dumps(payload))
        return [pickle.loads(self._store.get(f"{self._seq}/{r}")) for r in range(self.size())]

    def _allreduce_list(self, tensors: list[torch.Tensor], op: Any) -> None:
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
        everyone = self._exchange([t.detach().cpu() for t in inputs])
        for i, out_list in enumerate(outputs):
            for r, out in enumerate(out_list):
                out.copy_(everyone[r][i])
        return completed_work(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        everyone = self._exchange(input.detach().cpu())
        output.copy_(torch.cat([t.reshape(-1) for t in everyone]).reshape(output.shape))
        return completed_work(output)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        everyone = self._exchange([t.detach().cpu() for t in inputs])
        for i, out in enumerate(outputs):
            out.copy_(torch.cat([contrib[i].reshape(-1) for contrib in everyone]).reshape(out.shape))
        return completed_work(outputs)

    def _scatter_reduced(self, output: torch.Tensor, full: torch.Tensor) -> None:
        chunk = full.reshape(self.size(), -1)[self.rank()]
        output.copy_(chunk.reshape(output.shape))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        everyone = self._exchange(input.detach().cpu())
        self._scatter_reduced(output, _reduce(everyone, opts.reduceOp))
        return completed_work(output)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        everyone = self._exchange([t.detach().cpu() for t in inputs])
        for i, out in enumerate(outputs):
            self._scatter_reduced(out, _reduce([contrib[i] for contrib in everyone], opts.reduceOp))
        return completed_work(outputs)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        everyone = self._exchange([t.detach().cpu() for t in tensors])
        for i, t in enumerate(tensors):
            t.copy_(everyone[opts.rootRank][i])
        return completed_work(tensors)

    def barrier(self, opts: Any = None) -> dist.Work:
        self._exchange(None)
        return completed_work()

    # -- point to point -------------------------------------------------------
    def _p2p_key(self, src: int, dst: int) -> str:
        n = self._p2p.get((src, dst), 0) + 1
        self._p2p[(src, dst)] = n
        return f"p2p/{src}->{dst}/{n}"

    def _check_peer(self, op: str, peer: int) -> None:
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"toyccl rank {self.rank()}: {op}: invalid peer {peer} (group size {self.size()})")

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        self._check_peer("send", dst)
        self._store.set(self._p2p_key(self.rank(), dst), pickle.dumps([t.detach().cpu() for t in tensors]))
        return completed_work(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        self._check_peer("recv", src)
        received = pickle.loads(self._store.get(self._p2p_key(src, self.rank())))
        for t, r in zip(tensors, received, strict=True):
            if t.shape != r.shape or t.dtype != r.dtype:
                raise ValueError(f"toyccl rank {self.rank()}: recv from rank {src}: expected {r.dtype}{list(r.shape)} "
                                 f"as sent, but the receive buffer is {t.dtype}{list(t.shape)}")
            t.copy_(r)
        return completed_work(tensors)


def register(name: str = BACKEND_NAME, cls: type[ToyProcessGroup] = ToyProcessGroup) -> None:
    """Register ``cls`` with torch.distributed as backend ``name`` (CPU, extended API)."""

    def create(common: Any, pg_options: Any) -> ToyProcessGroup:
        return cls(common.store, common.group_rank, common.group_size, common.timeout)

    dist.Backend.register_backend(name, create, extended_api=True, devices=["cpu"])
