"""A check made to fail (a rank raising, crashing, hanging) is reported with the rank and the stack; the run goes on."""

import pytest

from conformance.planted.task import TASK as PLANTED
from conformance.runner.orchestrate import run_case
from conformance.runner.pool import PoolSet
from conformance.spec import load_catalog
from tests import state_tasks

REQ = {r.id: r for r in load_catalog()}


@pytest.fixture(scope="module")
def pools():
    p = PoolSet()
    yield p
    p.close()


@pytest.mark.parametrize(("kind", "status"), [("raise", "raised"), ("exit", "crashed"), ("hang", "timed out")])
def test_fault_is_reported_with_rank_and_stack_then_the_run_goes_on(pools, kind, status) -> None:
    req = REQ["COLL-ALLREDUCE-OPS"]  # its first collective is a plain all_reduce
    faulty = run_case(pools, req, "sim", 2, timeout_s=3.0, task=PLANTED, task_kwargs={"fault": f"1:allreduce:{kind}"})
    assert faulty.outcome == "error"
    rank1 = next(r for r in faulty.ranks if r.rank == 1)
    assert "rank 1" in faulty.detail
    if kind == "raise":
        assert "injected fault: rank 1 raised at allreduce" in faulty.detail
        assert "maybe_inject" in rank1.traceback
    else:
        assert rank1.status in ("crashed", "timeout")
        assert status.split()[0] in faulty.detail or "exit code" in faulty.detail
    if kind == "hang":
        assert "maybe_inject" in rank1.traceback  # the Python stack of the hung rank
    # the whole check (its generated cases take seconds, several times that on a loaded CI host) in a generous budget
    after = run_case(pools, req, "sim", 2, timeout_s=60.0)
    assert after.outcome == "pass", after.detail


def test_capability_gaps_skip_or_are_not_observable_with_the_capability_named(pools) -> None:
    skip = run_case(pools, REQ["SPLIT-LINEAGE"], "gloo", 2)
    assert skip.outcome == "skip" and "split" in skip.detail
    hookless = {"backend": "plainccl", "module": "tests.vendor.plain_backend"}  # no probe of its own
    blind = run_case(pools, REQ["P2P-LAZY-PAIR-COMM"], "vendor", 2, target_options=hookless)
    assert blind.outcome == "not-observable" and "observe:comm_created" in blind.detail


def test_process_state_does_not_leak_between_checks(pools) -> None:
    task = f"{state_tasks.__name__}:snapshot"
    before = [r.value for r in pools.get(2).run(task, {}, 30)]
    for rid in ("QUAL-OOT-REGISTRATION", "QUAL-OOT-REREGISTER", "HINT-TORCHCOMMS-OPTIONS", "SPLIT-MEMBERSHIP"):
        run_case(pools, REQ[rid], "sim", 2)
    after = [r.value for r in pools.get(2).run(task, {}, 30)]
    assert after == before
    assert not any(s["initialized"] for s in after)
    assert all("cfmtoy" not in s["backend_list"] and "SIM" not in s["plugins"] for s in after)
