"""Rendezvous sends: a send-before-recv deadlock, which hangs on NCCL, is reported on the simulator
naming both ranks and both ops; posted receives (recv first, or an irecv in the same batch) let
rendezvous sends complete. Before the rendezvous mode, sends were buffered and the deadlock passed."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from tests.clients.harness import BACKENDS, run_ranks, values

BIG = 4 << 20  # the default rendezvous threshold (NCCL_BUFFSIZE's default)
# A deadlock is reported after it; it is above the bound tests/conftest.py puts on a store connect's resolver
# stall (2 s).
TIMEOUT_S = 4


def rendezvous_init(backend: str, rank: int, n: int, port: int, tmpdir: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group(BACKENDS[backend], store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))


def send_first(numel: int):
    def body(rank: int, n: int) -> str:
        peer = 1 - rank
        try:
            dist.send(torch.full((numel,), float(rank)), dst=peer)
            got = torch.zeros(numel)
            dist.recv(got, src=peer)
        except Exception as exc:  # the report is the result
            return f"{type(exc).__name__}: {exc}"
        return "ok" if torch.equal(got, torch.full((numel,), float(peer))) else "wrong data"
    return body


def test_send_before_recv_deadlock_is_reported_naming_both_ranks_and_ops() -> None:
    got = values(run_ranks("sim", 2, send_first(BIG // 4), init=rendezvous_init, deadline_s=60), 2)
    for rank, report in enumerate(got):
        peer = 1 - rank
        assert report.startswith("P2PDeadlock"), f"rank {rank}: {report}"
        assert (f"rank {rank}: Timed out waiting 4000ms for send #0 of float32[1048576] (tag 0) to rank {peer} "
                "to complete") in report, report
        assert f"rank {peer} is blocked in send #0 of float32[1048576] (tag 0) to rank {rank}" in report, report


def test_small_sends_stay_buffered_by_default() -> None:
    """Below the threshold NCCL completes sends eagerly, and so does the simulator (positive control)."""
    assert values(run_ranks("sim", 2, send_first(16), init=rendezvous_init), 2) == ["ok", "ok"]


def test_threshold_zero_makes_every_send_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_P2P_RENDEZVOUS_BYTES", "0")  # inherited by the forked ranks
    got = values(run_ranks("sim", 2, send_first(16), init=rendezvous_init, deadline_s=60), 2)
    assert all(r.startswith("P2PDeadlock") and "float32[16]" in r for r in got), got


def test_off_buffers_every_send(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_P2P_RENDEZVOUS_BYTES", "off")
    assert values(run_ranks("sim", 2, send_first(BIG // 4), init=rendezvous_init), 2) == ["ok", "ok"]


def ordered_and_batched(rank: int, n: int) -> list[bool]:
    numel = BIG // 4
    out = []
    peer = 1 - rank
    mine, got = torch.full((numel,), float(rank)), torch.zeros(numel)
    if rank == 0:  # matched order: rank 0 sends first, rank 1 receives first
        dist.send(mine, dst=peer)
        dist.recv(got, src=peer)
    else:
        dist.recv(got, src=peer)
        dist.send(mine, dst=peer)
    out.append(torch.equal(got, torch.full((numel,), float(peer))))
    got.zero_()  # both send first, but in one batch with the receive: NCCL groups them
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, got, peer)]):
        work.wait()
    out.append(torch.equal(got, torch.full((numel,), float(peer))))
    got.zero_()  # isend first, then irecv, then wait: the receive is posted before anyone waits
    works = [dist.isend(mine, dst=peer), dist.irecv(got, src=peer)]
    for work in works:
        work.wait()
    out.append(torch.equal(got, torch.full((numel,), float(peer))))
    return out


def test_posted_receives_let_rendezvous_sends_complete() -> None:
    assert values(run_ranks("sim", 2, ordered_and_batched, init=rendezvous_init), 2) == [[True] * 3] * 2
