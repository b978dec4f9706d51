"""Exceptions raised by the simulator's data plane."""

from __future__ import annotations

from typing import Any

import torch


class SimError(RuntimeError):
    """Base class of every error raised by the simulator."""


class CollectiveMismatch(SimError):
    """Ranks issued different collectives (op, dtype, shape, root, reduce op or order) on one communicator."""


class RankTimeout(SimError):
    """A peer did not arrive in time; the message names the missing rank(s), the op, comm id and seq."""


class P2PMismatch(SimError):
    """A send and the receive it matched differ in size or dtype; the message names both ranks and the tag."""


class UnsupportedTensor(SimError):
    """An op was given a kind of tensor the simulator, like NCCL, does not take (sparse)."""


def refuse_sparse(op: str, tensors: list[Any], rank: int) -> None:
    """Refuse ``op`` on sparse tensors at the call, in NCCL's words ("NCCL does not support all_reduce with sparse
    tensors. Please use dense tensors instead.", ProcessGroupNCCL::allreduce_sparse); gloo alone takes them."""
    sparse = [str(t.layout) for t in tensors if t.layout != torch.strided]
    if sparse:
        raise UnsupportedTensor(f"rank {rank}: the simulator, like NCCL, does not support {op} with sparse tensors "
                                f"(got layout {', '.join(sparse)}). Please use dense tensors instead.")
