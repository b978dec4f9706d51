"""recv(src=None) works on a world initialised the default way (lazy), as on an eagerly bound one.

torch's own test_send_recv_any_source runs on such a world; the simulator used to refuse it there
("needs an eagerly initialised group") although its README lists any-source receives unconditionally.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simulator
from tests.clients.harness import run_ranks, values


def any_source(rank: int, n: int, bind: bool = False) -> list[list[float]]:
    """Rank 0 receives one message from every other rank, from any source; each carries its sender's rank."""
    if bind:
        simulator.bind_device(dist.group.WORLD)
    if rank != 0:
        dist.send(torch.full((2,), float(rank)), 0, tag=7)
        return []
    got = []
    for _ in range(n - 1):
        t = torch.zeros(2)
        src = dist.recv(t, tag=7)
        got.append([src, t[0].item()])
    return sorted(got)


@pytest.mark.parametrize("n", [2, 4])
def test_any_source_on_a_lazy_world_names_each_sender(n: int) -> None:
    got = values(run_ranks("sim", n, any_source, deadline_s=60), n)[0]
    assert got == [[r, float(r)] for r in range(1, n)], f"rank 0: expected one message from each of 1..{n - 1} " \
        f"carrying its sender's rank, observed (source, value) {got}"


def test_any_source_on_a_bound_world_still_works() -> None:
    got = values(run_ranks("sim", 3, lambda r, n: any_source(r, n, bind=True), deadline_s=60), 3)[0]
    assert got == [[1, 1.0], [2, 2.0]], f"rank 0: observed (source, value) {got}"
