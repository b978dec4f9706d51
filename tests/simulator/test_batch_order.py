"""batch_isend_irecv with the receives first completes on the simulator, as on gloo and NCCL.

torch documents that the order of sends and receives in a batch does not matter (v2.13.0
distributed_c10d.py:3000); pipeline schedules post their receives first. torch < 2.14 hands a Python
group's batch over op by op (v2.13.0 :3049), so without the simulator's own grouping the queued
irecv blocked the pair's ordered stream on both ranks until the group timeout.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from tests.clients.harness import BACKENDS, run_ranks, values


def _short_timeout_init(backend: str, rank: int, n: int, port: int, tmpdir: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group(BACKENDS[backend], store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=5))


def receives_first(rank: int, n: int) -> list[list[float]]:
    """Each rank exchanges two tagged messages with each neighbour, every receive listed before its send."""
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    got = [torch.zeros(3) for _ in range(4)]
    ops = [dist.P2POp(dist.irecv, got[0], prv, tag=1), dist.P2POp(dist.irecv, got[1], nxt, tag=2),
           dist.P2POp(dist.irecv, got[2], prv, tag=3), dist.P2POp(dist.irecv, got[3], nxt, tag=4),
           dist.P2POp(dist.isend, torch.full((3,), 10.0 * rank + 1), nxt, tag=1),
           dist.P2POp(dist.isend, torch.full((3,), 10.0 * rank + 2), prv, tag=2),
           dist.P2POp(dist.isend, torch.full((3,), 10.0 * rank + 3), nxt, tag=3),
           dist.P2POp(dist.isend, torch.full((3,), 10.0 * rank + 4), prv, tag=4)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return [t.tolist() for t in got]


def test_batch_with_receives_first_completes_with_exact_data() -> None:
    for n in (2, 3):
        got = values(run_ranks("sim", n, receives_first, init=_short_timeout_init, deadline_s=60), n)
        for rank in range(n):
            nxt, prv = (rank + 1) % n, (rank - 1) % n
            want = [[10.0 * prv + 1] * 3, [10.0 * nxt + 2] * 3, [10.0 * prv + 3] * 3, [10.0 * nxt + 4] * 3]
            assert got[rank] == want, f"world of {n}, rank {rank}: expected {want}, observed {got[rank]}"
