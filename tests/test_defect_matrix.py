"""The defect matrix: 100% both ways and a clean simulator passing every MUST (the matrix in first-catch mode: the
same verdicts as the whole one, benchmarks/bench_defect_matrix.py compares them)."""

import json
from pathlib import Path

import pytest

from conformance.defect_matrix import _consulted, _retry_unjudged, build_matrix, earlier_catches, plan, run_matrix
from conformance.planted.lanes import Case, CaseOutcome
from conformance.planted.mutants import Mutant, mutants
from conformance.planted.task import TASK
from conformance.runner.orchestrate import run_case
from conformance.runner.pool import PoolSet
from conformance.session import load_bound_catalog

ROOT = Path(__file__).resolve().parents[1]


def test_build_matrix_flags_uncaught_defects_and_toothless_requirements() -> None:
    clean = {"A": "pass", "B": "pass", "C": "fail"}
    matrix = build_matrix(clean, {"d1": {"A": "fail", "B": "pass", "C": "fail"}, "d2": clean},
                          {"A": "MUST", "B": "MUST", "C": "SHOULD"})
    assert matrix["uncaught_mutants"] == ["d2"]
    assert matrix["requirements_without_teeth"] == ["B"]
    assert matrix["not_judged_on_sim"] == {"C": "fail"}
    fixed = build_matrix(clean, {"d1": {"A": "fail", "B": "pass", "C": "fail"}},
                         {"A": "MUST", "B": "SHOULD", "C": "SHOULD"}, frozenset({"B"}))
    assert fixed["requirements_without_teeth"] == [] and fixed["fixed_upstream"] == ["B"]
    assert fixed["teeth_rate"] == 1.0


def test_plan_runs_a_switch_or_front_end_mutant_only_where_the_clean_run_met_it() -> None:
    catalog = load_bound_catalog()[:3]
    a, b, c = (r.id for r in catalog)
    switch = Mutant("avg_as_sum", "", defects=("avg_as_sum",))
    frontend = Mutant("frontend_filter_ignored", "", frontend="frontend_filter_ignored")
    builder = Mutant("derived_groups_fixed_order", "", group_builder="conformance.planted.builders:x")
    consulted = {a: {"avg_as_sum", "barrier_no_wait"}, b: {"barrier_no_wait", "frontend_filter_ignored"}}
    cases = plan(catalog, [2, 4], [switch, frontend, builder], consulted)
    assert [x.requirement for x in cases if x.mutant == "avg_as_sum"] == [a]
    assert [x.requirement for x in cases if x.mutant == "frontend_filter_ignored"] == [b]
    assert [x.requirement for x in cases if x.mutant == "derived_groups_fixed_order"] == [a, b, c]  # not recorded
    assert len(plan(catalog, [2, 4], [switch], consulted, everything=True)) == 3
    assert all(isinstance(x, Case) and x.world_size in (2, 4) for x in cases)


def test_a_clean_case_without_a_verdict_runs_again_alone_with_more_time() -> None:
    """A clean error (four lanes of ranks on two cores ran P2P-DATA past 8 s in CI) is run again with five times
    the timeout; a pass then is the baseline, a second error stands; failures and passes are not run again."""
    asked: list[Case] = []

    class Pool:
        def run(self, cases: list[Case]) -> list[CaseOutcome]:
            asked.extend(cases)
            return [CaseOutcome(c, "pass" if c.requirement == "SLOW" else "error", "again", 1.0) for c in cases]

    first = [CaseOutcome(Case(rid, 2), outcome, "timed out after 8 s", 8.0)
             for rid, outcome in (("SLOW", "error"), ("BROKEN", "error"), ("BAD", "fail"), ("GOOD", "pass"))]
    again = _retry_unjudged(Pool(), first, 8.0, lambda *a, **k: None)  # type: ignore[arg-type]
    assert [(c.requirement, c.timeout_s) for c in asked] == [("SLOW", 40.0), ("BROKEN", 40.0)]
    assert {rid: o.outcome for rid, o in again.items()} == {"SLOW": "pass", "BROKEN": "error"}


def test_every_planted_defect_is_listed_once() -> None:
    names = [m.name for m in mutants()]
    assert len(names) == len(set(names)) == 57  # with complex_product_partwise and three others of 2026-11-29


def test_the_planted_task_records_consulted_switches_and_plants_a_mutant(tmp_path: Path) -> None:
    reqs = {r.id: r for r in load_bound_catalog()}
    pools = PoolSet()
    try:
        clean = run_case(pools, reqs["COLL-BARRIER-BLOCKS"], "sim", 2, timeout_s=15.0, task=TASK,
                         task_kwargs={"consulted_dir": str(tmp_path)})
        batch = reqs["P2P-BAD-INPUT"]
        planted = run_case(pools, batch, "sim", 2, timeout_s=15.0, task=TASK,
                           task_kwargs={"mutant": "frontend_empty_batch_accepted"})
        after = run_case(pools, batch, "sim", 2, timeout_s=15.0)  # the mutant was undone with its check
    finally:
        pools.close()
    assert clean.outcome == "pass", clean.detail
    consulted = _consulted(tmp_path)["COLL-BARRIER-BLOCKS"]
    assert "barrier_no_wait" in consulted and "p2p_mismatch_silent" not in consulted, consulted
    assert "frontend_malformed_accepted" in consulted, consulted  # it calls init_process_group, which that wraps
    assert "frontend_empty_batch_accepted" not in consulted, consulted  # it never calls batch_isend_irecv
    assert planted.outcome == "fail" and after.outcome == "pass", (planted.detail, after.detail)


@pytest.mark.slow
def test_every_defect_caught_every_requirement_has_teeth(tmp_path: Path) -> None:
    # headroom: CI runs this beside other tests on 2 cores; first catch: the verdicts, not every pair's outcome
    code = run_matrix([2, 4], tmp_path, timeout_s=8.0, first_catch=True,
                      earlier=earlier_catches(ROOT / "reports" / "defects.json"))
    matrix = json.loads((tmp_path / "defects.json").read_text())
    verdicts = {k: matrix[k] for k in ("uncaught_mutants", "requirements_without_teeth", "clean_must_failures")}
    assert code == 0, f"{verdicts}; clean outcomes: {matrix['clean']}; why: {matrix['clean_failure_details']}"
    assert matrix["kill_rate"] == 1.0 and matrix["teeth_rate"] == 1.0
    md = (tmp_path / "defects.md").read_text()
    assert "| defect | caught by |" in md and "first catch only: " in md


def test_a_failing_rank_stops_its_peers_in_the_matrix_instead_of_letting_them_wait() -> None:
    """split_nonmember_raises: the non-member fails at once while the member waits in split_group for it. The
    matrix's cases stop the member soon after; the runner's own cases let it wait (its account is reported)."""
    req = {r.id: r for r in load_bound_catalog()}["SPLIT-PARTIAL-NONMEMBER"]
    pools = PoolSet()
    try:
        stopped = run_case(pools, req, "sim", 2, target_options={"defects": ["split_nonmember_raises"]},
                           timeout_s=30.0, task=TASK, task_kwargs={"mutant": "split_nonmember_raises"},
                           stop_on_failure=True)
        waited = run_case(pools, req, "sim", 2, target_options={"defects": ["split_nonmember_raises"]},
                          timeout_s=3.0)
    finally:
        pools.close()
    assert stopped.outcome.failing and stopped.duration_s < 10, (stopped.duration_s, stopped.detail)
    assert "rank 1: partial split [0]: non-member raised" in stopped.detail
    assert "rank 0 was abandoned after a peer failed" in stopped.detail, stopped.detail
    assert waited.outcome == "fail" and waited.duration_s >= 3.0, (waited.duration_s, waited.detail)
    assert "rank 0: partial split [0]: member raised RankTimeout" in waited.detail, waited.detail


def test_a_hang_in_a_checks_subgroup_times_out_within_the_checks_timeout() -> None:
    """Checks make their subgroups with the check's timeout (torch's default is 30 min): a backend that hangs
    in one is reported by the rank itself, naming the absent rank, not by the pool after its grace."""
    req = {r.id: r for r in load_bound_catalog()}["SPLIT-MEMBERSHIP"]
    pools = PoolSet()
    try:
        result = run_case(pools, req, "sim", 2, target_options={"defects": ["split_ranks_as_global"]}, timeout_s=3.0)
    finally:
        pools.close()
    assert result.outcome == "error", result.detail
    assert "rank 1: RankTimeout" in result.detail, result.detail
    assert "Timed out waiting 3000ms for " in result.detail, result.detail
    assert "ranks [0] never arrived" in result.detail, result.detail


def test_comm_id_by_members_shows_the_same_symptom_every_run() -> None:
    """comm_id_by_members used to make a second live communicator under an id in use, and COLL-ROOTED at world
    size 4 passed or erred by which rank read a shared store key first; the flaw now hands every group of the
    same ranks the one communicator (simulator/flaws.py), so its outcomes repeat: COLL-ROOTED passes, and
    SPLIT-NEWGROUP-NAMES (repeated groups on distinct communicators) fails."""
    reqs = {r.id: r for r in load_bound_catalog()}
    pools = PoolSet()
    try:
        planted = {"defects": ["comm_id_by_members"]}
        rooted = [run_case(pools, reqs["COLL-ROOTED"], "sim", 4, target_options=planted, timeout_s=15.0)
                  for _ in range(3)]
        names = run_case(pools, reqs["SPLIT-NEWGROUP-NAMES"], "sim", 4, target_options=planted, timeout_s=15.0)
    finally:
        pools.close()
    assert [r.outcome for r in rooted] == ["pass"] * 3, [r.detail for r in rooted]
    assert names.outcome == "fail" and "communicators of the repeated groups" in names.detail, names.detail


def test_first_catch_skips_only_cases_that_can_change_no_verdict() -> None:
    from conformance.defect_matrix import _FirstCatch

    clean, levels = {"A": "pass", "B": "pass", "C": "skip"}, {"A": "MUST", "B": "MUST", "C": "MUST"}
    tracker = _FirstCatch(clean, levels)
    assert not tracker.wanted(Case("C", 2, "d1"))  # C does not pass clean: it cannot catch anything
    tracker.record(CaseOutcome(Case("A", 2, "d1"), "fail", "", 0.1))  # A catches d1: d1 caught, A has teeth
    assert not tracker.wanted(Case("A", 2, "d1"))
    assert tracker.wanted(Case("B", 2, "d1"))  # B has no teeth yet: it may still catch d1
    assert tracker.wanted(Case("A", 2, "d2"))  # d2 is not caught yet
    tracker.record(CaseOutcome(Case("B", 2, "d2"), "pass", "", 0.1))
    assert tracker.wanted(Case("B", 2, "d1"))  # a pass gives neither teeth nor a catch
    assert tracker.skipped == {"d1": ["C", "A"]}


def test_catches_first_orders_earlier_catches_then_cheapest() -> None:
    from conformance.defect_matrix import catches_first

    cases = [Case(r, 2, m) for m in ("d1", "d2") for r in ("SLOW", "CHEAP", "KILLER")]
    ordered = catches_first(cases, {"d1": ["KILLER"], "d2": ["SLOW"]}, {"SLOW": 9.0, "CHEAP": 0.1, "KILLER": 2.0})
    assert [(c.mutant, c.requirement) for c in ordered] == [
        ("d1", "KILLER"), ("d2", "SLOW"), ("d1", "CHEAP"), ("d2", "CHEAP"), ("d2", "KILLER"), ("d1", "SLOW")]
