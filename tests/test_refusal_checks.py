"""The refusal requirements (COLL-BAD-ARGS-REFUSED, COLL-MISMATCH-REFUSED, COLL-ABSENT-PEER): each passes on the
clean simulator and fails on the planted defect written for it, at world size 2; their plans hold every
boundary rank and are the same on every rank."""

from __future__ import annotations

import pytest

from conformance.checks import collective_refusals as refusals
from conformance.checks.cases import Generation
from conformance.runner.orchestrate import run_case
from conformance.runner.pool import PoolSet
from conformance.session import load_bound_catalog

DEFECT_OF = {
    "COLL-BAD-ARGS-REFUSED": ("allgather_short_list_accepted", "all_gather: too few outputs"),
    "COLL-MISMATCH-REFUSED": ("collective_calls_by_name", "expected an error, observed success"),
    "COLL-ABSENT-PEER": ("allreduce_timeout_swallowed", "expected an error, observed success"),
}


@pytest.fixture(scope="module")
def pools() -> PoolSet:
    pool_set = PoolSet()
    yield pool_set
    pool_set.close()


@pytest.mark.parametrize("requirement", sorted(DEFECT_OF))
def test_passes_clean_and_fails_its_planted_defect(pools: PoolSet, requirement: str) -> None:
    req = {r.id: r for r in load_bound_catalog()}[requirement]
    defect, says = DEFECT_OF[requirement]
    clean = run_case(pools, req, "sim", 2, timeout_s=20.0)
    planted = run_case(pools, req, "sim", 2, target_options={"defects": [defect]}, timeout_s=20.0)
    assert clean.outcome == "pass", clean.detail
    assert planted.outcome == "fail", (planted.outcome, planted.detail)
    assert says in planted.detail, planted.detail


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_plans_hold_the_first_middle_and_last_rank_and_depend_on_the_seed_only(n: int) -> None:
    gen = Generation(seed=3, budget=2)
    for plan in (refusals.bad_args_plan(n), refusals.mismatch_plan(n), refusals.absent_plan(n)):
        cases = plan.cases(gen, n)
        assert cases == plan.cases(gen, n)
        hit = plan.coverage(cases)
        assert all(hit[dim] == [str(v) for v in values] for dim, values in plan.dims.items()), (plan.name, hit)
    assert {0, n // 2, n - 1} <= set(refusals.mismatch_plan(n).dims["odd rank"])
    assert "every rank" in refusals.bad_args_plan(n).dims["wrong on"]
