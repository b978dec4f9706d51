"""summary.judged: which backend MUSTs reached a verdict; the unjudged ones lead the Markdown."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.outcomes import Outcome
from conformance.report import RankOutcome, Result, build_report, render_markdown
from conformance.report import build as build_module
from conformance.report.build import judged_musts
from conformance.spec import load_catalog

ENV = {"python": "3.11.7", "torch": "2.13.0", "torchcomms": None, "nccl": None, "suite": "0.1.0", "spec": "1",
       "host": "test"}


def res(rid: str, outcome: str, ws: int = 2, level: str = "MUST", **kw) -> Result:
    return Result(requirement=rid, area="split", level=level, world_size=ws, outcome=outcome,
                  detail=kw.pop("detail", ""), duration_s=0.1, **kw)


RESULTS = [
    res("SPLIT-MEMBERSHIP", "pass"), res("SPLIT-MEMBERSHIP", "pass", ws=4),
    res("SPLIT-DERIVED-GROUPS", "skip", detail="world sizes 4, 8 only"), res("SPLIT-DERIVED-GROUPS", "fail", ws=4),
    res("SPLIT-LINEAGE", "skip", detail="target t lacks capability split, device_binding"),
    res("P2P-LAZY-PAIR-COMM", "not-observable", detail="target t cannot observe observe:comm_created"),
    res("P2P-MISMATCH", "waived", waiver={"requirement": "P2P-MISMATCH", "expected": "fail", "observed": "fail",
                                          "reason": "r", "issue": "i"}),
    res("HINT-INIT-OPTIONS", "waived", waiver={"requirement": "HINT-INIT-OPTIONS", "expected": "not-observable",
                                               "observed": "not-observable", "reason": "r", "issue": "i"}),
    res("COAL-MIXED-REDUCEOPS", "pass", level="SHOULD"),
]


def test_counts_only_musts_with_a_verdict_and_names_what_the_others_lacked():
    judged = judged_musts(RESULTS, capabilities={"split", "custom_backend", "options"})
    assert judged["backend_musts"] == 6
    # a fail at one size is a verdict; a waived fail is one; a waived not-observable is not
    assert judged["judged_requirements"] == ["P2P-MISMATCH", "SPLIT-DERIVED-GROUPS", "SPLIT-MEMBERSHIP"]
    unjudged = {u["requirement"]: u["missing"] for u in judged["unjudged"]}
    assert unjudged == {"SPLIT-LINEAGE": ["device_binding", "observe:comm_created"],
                        "P2P-LAZY-PAIR-COMM": ["observe:comm_created"], "HINT-INIT-OPTIONS": ["observe:config"]}


def test_frontend_requirements_count_neither_in_judged_nor_in_the_verdict(monkeypatch):
    catalog = [dataclasses.replace(r, kind="frontend") if r.id == "SPLIT-DERIVED-GROUPS" else r
               for r in load_catalog()]
    monkeypatch.setattr(build_module, "load_catalog", lambda: catalog)
    judged = judged_musts(RESULTS)
    assert "SPLIT-DERIVED-GROUPS" not in judged["judged_requirements"] and judged["backend_musts"] == 5
    # its fail is torch's front end, not the backend: the verdict does not turn non-conformant on it
    assert build_report("t", RESULTS, ENV)["verdict"] == "conformant-with-waivers"


def test_report_summary_and_markdown_lead_with_the_unjudged():
    report = build_report("t", RESULTS, ENV, capabilities={"split"})  # validates against the schema
    text = render_markdown(report)
    assert "**Judged 3 of 6 backend MUST requirements** that apply" in text
    head = text.split("## Failures")[0]
    assert head.startswith("# Conformance report: t") and "## Summary" in head
    assert "not judged, capability lacking (not declared): `SPLIT-LINEAGE`" in head
    table = text[text.index("## Not judged"):text.index("## Matrix")]
    assert "`SPLIT-LINEAGE` | capability lacking (not declared) | device_binding" in table


@pytest.mark.parametrize("outcome", ["pass", "fail", "error"])
def test_every_verdict_counts_as_judged(outcome):
    assert judged_musts([res("SPLIT-MEMBERSHIP", outcome)])["judged"] == 1


def test_requirements_that_cannot_apply_leave_the_denominator_apart_from_capabilities_not_declared():
    ran = RankOutcome(0, "skip", "rank 0: made no communicator for lazy P2P")
    results = [
        res("SPLIT-MEMBERSHIP", "pass"),
        # a check that ran and found none of what it judges (no pair communicators): cannot apply
        res("P2P-LAZY-PAIR-COMM", "skip", detail="ranks 0, 1: target t made no communicator for lazy P2P: the "
            "requirement applies to backends that make pair communicators", ranks=[ran]),
        res("HINT-TORCHCOMMS-OPTIONS", "skip", detail="target t lacks capability torchcomms, options"),
        res("SPLIT-LINEAGE", "skip", detail="target t lacks capability device_binding"),
        # a skip inside a check naming a capability the target lacks is a capability not declared
        res("P2P-EAGER-REUSE", "skip", detail="rank 0: an eager world needs capability device_binding", ranks=[ran]),
        res("SPLIT-VALIDATION", "skip", detail="requirement runs at world sizes [4] only"),
        res("P2P-LAZY-WARN-ONCE", "not-observable", detail="target t cannot observe observe:comm_created"),
    ]
    judged = judged_musts(results, capabilities={"split", "custom_backend", "observe:launch"})
    assert {n["requirement"] for n in judged["not_applicable"]} == {"P2P-LAZY-PAIR-COMM", "HINT-TORCHCOMMS-OPTIONS"}
    assert judged["backend_musts"] == 5 and judged["judged"] == 1
    assert {u["requirement"]: u["why"] for u in judged["unjudged"]} == {
        "SPLIT-LINEAGE": "capability", "P2P-EAGER-REUSE": "capability", "SPLIT-VALIDATION": "not-run",
        "P2P-LAZY-WARN-ONCE": Outcome.NOT_OBSERVABLE.value}
    report = build_report("t", results, ENV, capabilities={"split"})  # validates against the schema
    table = render_markdown(report).split("cannot apply to this target (not counted)")[1]
    assert "`HINT-TORCHCOMMS-OPTIONS` | needs torchcomms" in table
