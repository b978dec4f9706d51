"""The records a case passes through, the Outcome enum they carry, and the messages a case reports."""

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.outcomes import Outcome, worst
from conformance.report import RankOutcome, Result
from conformance.report.build import schema
from conformance.report.details import merge_details, rank_span
from conformance.runner.orchestrate import aggregate
from conformance.spec.datafile import schema as data_schema
from conformance.verdict import ExitCode, Verdict

ROOT = Path(__file__).resolve().parents[2]


def test_outcome_owns_failing_and_severity():
    assert {o for o in Outcome if o.failing} == {Outcome.FAIL, Outcome.ERROR}
    by_severity = sorted(Outcome, key=lambda o: o.severity, reverse=True)
    assert by_severity == [Outcome.ERROR, Outcome.FAIL, Outcome.NOT_OBSERVABLE, Outcome.SKIP, Outcome.WAIVED,
                           Outcome.PASS]
    assert worst([Outcome.PASS, Outcome.SKIP, Outcome.FAIL]) is Outcome.FAIL
    assert worst([]) is Outcome.ERROR  # no rank reported anything


def test_the_schemas_spell_the_outcomes_of_the_enum():
    assert schema()["$defs"]["outcome"]["enum"] == [o.value for o in Outcome]
    expected = data_schema("expectation.schema.json")["properties"]["outcome"]["enum"]
    assert {Outcome(o) for o in expected} == {o for o in Outcome if o.failing} | {Outcome.NOT_OBSERVABLE}


def test_no_outcome_string_literals_outside_the_enum_module():
    values = {o.value for o in Outcome}
    hits = [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
            for path in sorted((ROOT / "conformance").rglob("*.py")) if path.name != "outcomes.py"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and node.value in values]
    assert hits == []


def test_records_round_trip_through_their_one_wire_form():
    crashed = RankOutcome(1, Outcome.ERROR, "rank 1 crashed: killed by signal SIGSEGV", "stack", status="crashed",
                          exitcode=-11)
    passed = RankOutcome(0, Outcome.PASS, notes=["rank 0: seen"], duration_s=0.25)
    assert passed.to_json() == {"rank": 0, "outcome": "pass", "detail": "", "traceback": "",
                                "notes": ["rank 0: seen"], "duration_s": 0.25}
    assert crashed.to_json()["status"] == "crashed" and crashed.to_json()["exitcode"] == -11
    for rank in (crashed, passed):
        assert RankOutcome.from_json(json.loads(json.dumps(rank.to_json()))) == rank
    result = Result("SPLIT-MEMBERSHIP", "split", "MUST", 2, Outcome.ERROR, crashed.detail, 1.5, "sim",
                    ranks=[RankOutcome(0, Outcome.PASS), crashed], notes=["n"])
    wire = json.loads(json.dumps(result.to_json()))
    assert wire["outcome"] == "error" and "status" not in wire["ranks"][0]
    assert Result.from_json(wire) == result
    with pytest.raises(ValueError, match="'passed' is not a valid Outcome"):
        RankOutcome.from_json({"rank": 0, "outcome": "passed"})


def test_rank_span_names_ranks_compactly():
    assert rank_span([2]) == "rank 2"
    assert rank_span([1, 0]) == "ranks 0, 1"
    assert rank_span([0, 1, 2, 3, 6]) == "ranks 0-3, 6"


def test_each_distinct_failure_is_reported_once_naming_its_ranks():
    same = "all_reduce SUM: expected [6.0], observed [4.0]"
    ranks = [RankOutcome(r, Outcome.FAIL, f"rank {r}: {same}") for r in range(3)]
    ranks.append(RankOutcome(3, Outcome.FAIL, "rank 3: all_reduce SUM: expected [6.0], observed [5.0]"))
    ranks.append(RankOutcome(4, Outcome.PASS))
    outcome, detail = aggregate(ranks)
    assert outcome is Outcome.FAIL
    assert detail == f"ranks 0-2: {same}; rank 3: all_reduce SUM: expected [6.0], observed [5.0]"


def test_the_most_severe_rank_decides_and_every_failing_rank_is_named():
    ranks = [RankOutcome(0, Outcome.FAIL, "rank 0: barrier: expected a wait, observed none"),
             RankOutcome(1, Outcome.ERROR, "rank 1 crashed: killed by signal SIGSEGV", status="crashed"),
             RankOutcome(2, Outcome.SKIP, "needs split")]
    assert aggregate(ranks) == (Outcome.ERROR, "rank 0: barrier: expected a wait, observed none; "
                                               "rank 1 crashed: killed by signal SIGSEGV")
    skips = [RankOutcome(r, Outcome.SKIP, "target lacks split") for r in range(4)]
    assert aggregate(skips) == (Outcome.SKIP, "target lacks split")
    assert merge_details([(0, "rank 0: x"), (1, "rank 0: x")]) == "rank 0: x; rank 0: x"  # another rank's words
    raised = [(r, f"rank {r} raised: ValueError: x") for r in range(4)] + [(1, "rank 10 raised: y")]
    assert merge_details(raised) == "ranks 0-3 raised: ValueError: x; rank 10 raised: y"


def test_exit_codes():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4]
    assert ExitCode.for_verdict(Verdict.CONFORMANT) is ExitCode.OK
    assert ExitCode.for_verdict(Verdict.CONFORMANT_WITH_WAIVERS) is ExitCode.OK
    assert ExitCode.for_verdict(Verdict.NON_CONFORMANT) is ExitCode.NON_CONFORMANT
    assert ExitCode.for_verdict(Verdict.INCOMPLETE) is ExitCode.INCOMPLETE


def test_pytest_writes_the_report_the_cli_would(tmp_path):
    """The pytest collector and the CLI share finish_run: the same results give the same report (waivers,
    stale waivers, out-of-range waivers, what each unjudged MUST lacked), and a run that took time says so."""
    from conformance.pytest_plugin import _PROPERTY, _Collector
    from conformance.session import SuiteRun, finish_run, load_target_expectations
    from conformance.targets import make_target

    def case(rid: str, ws: int, outcome: Outcome) -> Result:
        return Result(rid, "p2p", "MUST", ws, outcome, f"rank 0: {rid}", 0.1, "gloo",
                      ranks=[RankOutcome(0, outcome, f"rank 0: {rid}")])

    ran = [case("P2P-MISMATCH", 2, Outcome.ERROR), case("P2P-PEER-OUTSIDE", 2, Outcome.PASS),  # gloo aborts
           case("SPLIT-MEMBERSHIP", 2, Outcome.SKIP), case("P2P-NAMED-SENDERS", 2, Outcome.PASS)]
    collector = _Collector(tmp_path)
    collector.started = "2026-01-01T00:00:00+00:00"
    for result in ran:
        props = [(_PROPERTY, json.dumps(result.to_json()))]
        collector.pytest_runtest_logreport(SimpleNamespace(when="call", user_properties=props))
        collector.pytest_runtest_logreport(SimpleNamespace(when="teardown", user_properties=[]))
    collector.pytest_sessionfinish(SimpleNamespace(shouldstop=False, shouldfail=False, testscollected=len(ran)), 0)
    written = json.loads((tmp_path / "gloo.json").read_text())
    expected = finish_run(SuiteRun(results=ran, started=collector.started), make_target("gloo"),
                          load_target_expectations("gloo")).report
    drop = ("finished", "digest")
    assert {k: v for k, v in written.items() if k not in drop} == {k: v for k, v in expected.items() if k not in drop}
    assert written["started"] < written["finished"]
    assert [r["outcome"] for r in written["results"]] == ["waived", "pass", "skip", "pass"]
    assert [s["requirement"] for s in written["stale_waivers"]] == ["P2P-PEER-OUTSIDE"]
    assert {u["requirement"]: u["missing"] for u in written["summary"]["judged"]["unjudged"]} == {
        "SPLIT-MEMBERSHIP": ["split"]}
    assert written["interrupted"] is False


def test_a_pytest_run_with_fewer_items_finished_than_collected_is_marked_interrupted(tmp_path):
    """Whatever the exit status (a second Ctrl-C can break pytest's own reporting), an item that never
    finished makes the report interrupted, with no verdict claimed."""
    from conformance.pytest_plugin import _PROPERTY, _Collector

    result = Result("P2P-DATA", "p2p", "MUST", 2, Outcome.PASS, "", 0.1, "sim",
                    ranks=[RankOutcome(0, Outcome.PASS, "")])
    props = [(_PROPERTY, json.dumps(result.to_json()))]
    collector = _Collector(tmp_path)
    collector.pytest_runtest_logreport(SimpleNamespace(when="call", user_properties=props))
    collector.pytest_runtest_logreport(SimpleNamespace(when="teardown", user_properties=[]))
    collector.pytest_sessionfinish(SimpleNamespace(shouldstop=False, shouldfail=False, testscollected=2), 0)
    written = json.loads((tmp_path / "sim.json").read_text())
    assert written["interrupted"] is True and written["verdict"] == "incomplete"
