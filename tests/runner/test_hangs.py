"""Hangs and crashes are named: the hung rank at any timeout, a segfault's stack; peers are released at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conformance.planted.task import TASK as PLANTED
from conformance.runner import PoolSet, RankPool
from conformance.runner.orchestrate import run_case
from conformance.spec import load_catalog

from . import tasks

T = tasks.__name__
REQ = {r.id: r for r in load_catalog()}


@pytest.fixture(scope="module")
def pools():
    pool_set = PoolSet()
    yield pool_set
    pool_set.close()


def test_hung_rank_is_named_above_the_pool_grace(pools) -> None:
    """At a timeout above the pool's 5 s grace the healthy rank's RankTimeout, naming rank 0, is kept."""
    result = run_case(pools, REQ["COLL-ALLREDUCE-OPS"], "sim", 2, timeout_s=8.0,
                      task=PLANTED, task_kwargs={"fault": "0:allreduce:hang"})
    by_rank = {r.rank: r for r in result.ranks}
    assert result.outcome == "error"
    assert by_rank[0].status == "timeout", by_rank[0]
    assert "maybe_inject" in by_rank[0].traceback
    assert by_rank[1].status is None, by_rank[1]  # rank 1 answered with its own outcome
    assert "RankTimeout" in by_rank[1].detail and "rank(s) 0 did not arrive" in by_rank[1].detail
    assert "rank 0 timed out" in result.detail


def test_peers_of_a_raising_rank_do_not_wait_out_the_timeout(pools) -> None:
    started = time.monotonic()
    result = run_case(pools, REQ["COLL-ALLREDUCE-OPS"], "sim", 2, timeout_s=30.0,
                      task=PLANTED, task_kwargs={"fault": "0:allreduce:raise"})
    assert time.monotonic() - started < 10, "rank 1 waited for the rank that had already raised"
    assert result.outcome == "error" and "injected fault: rank 0 raised at allreduce" in result.detail
    rank1 = next(r for r in result.ranks if r.rank == 1)
    assert rank1.status == "aborted" and "[0] failed" in rank1.detail


def test_peers_of_a_crashed_rank_released_within_a_second(tmp_path: Path) -> None:
    pool = RankPool(3)
    try:
        when = tmp_path / "crash-time"
        reports = pool.run(f"{T}:exit_at_recorded_time", {"bad_rank": 1, "path": str(when)}, timeout_s=60)
        released = time.time()
        assert [r.status for r in reports] == ["aborted", "crashed", "aborted"]
        assert released - float(when.read_text()) < 1.0
    finally:
        pool.close()


def test_segfault_has_the_stack_of_the_crash() -> None:
    pool = RankPool(2)
    try:
        reports = pool.run(f"{T}:segfault_on", {"bad_rank": 0}, timeout_s=60)
        assert reports[0].status == "crashed" and "SIGSEGV" in reports[0].error
        assert "segfault_on" in reports[0].traceback and "Segmentation fault" in reports[0].traceback
    finally:
        pool.close()


def test_p2p_mismatch_passes_on_the_error_not_a_timeout(pools) -> None:
    started = time.monotonic()
    result = run_case(pools, REQ["P2P-MISMATCH"], "sim", 2, timeout_s=30.0)
    assert result.outcome == "pass", result.detail
    assert time.monotonic() - started < 25  # well under the 30 s a refused second send made rank 1 wait
