"""all_reduce of a sparse tensor is refused at the call, naming sparse tensors, as NCCL refuses it.

NCCL: "NCCL does not support all_reduce with sparse tensors. Please use dense tensors instead."
(ProcessGroupNCCL::allreduce_sparse); torch's own test says "Only Gloo backend supports sparse all
reduce" (v2.13.0 distributed_test.py:2979). The simulator crashed inside its reduction instead
("Cannot access storage of SparseTensorImpl").
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.clients.harness import run_ranks, values


def sparse_then_dense(rank: int, n: int) -> list:
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,))
    try:
        dist.all_reduce(sparse)
        refusal = "no error"
    except RuntimeError as exc:
        refusal = str(exc)
    dense = torch.full((3,), float(rank + 1))
    dist.all_reduce(dense)  # the group stays usable: nothing was launched
    return [refusal, dense.tolist()]


def test_sparse_all_reduce_is_refused_naming_sparse_tensors_and_the_group_stays_usable() -> None:
    n = 2
    got = values(run_ranks("sim", n, sparse_then_dense, deadline_s=60), n)
    for rank, (refusal, dense) in enumerate(got):
        assert "sparse" in refusal and "all_reduce" in refusal and f"rank {rank}" in refusal, \
            f"rank {rank}: expected a refusal naming all_reduce, sparse tensors and the rank, observed {refusal!r}"
        assert dense == [3.0] * 3, f"rank {rank}: dense all_reduce after the refusal: expected [3.0] * 3, got {dense}"
