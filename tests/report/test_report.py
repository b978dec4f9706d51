import hashlib
import json
import os

import jsonschema
import pytest

from conformance.report import (
    RankOutcome,
    Result,
    build_report,
    collect_environment,
    compute_verdict,
    load_report,
    render_markdown,
    verify_digest,
    write_report,
)
from conformance.report.build import schema, validate_report
from conformance.verdict import Verdict

ENV = {
    "python": "3.11.7", "torch": "2.13.0", "torchcomms": None, "nccl": None,
    "suite": "0.1.0", "spec": "1", "host": "test",
}


def res(rid="QUAL-1", outcome="pass", level="MUST", ws=2, area="qualification", **kw):
    return Result(requirement=rid, area=area, level=level, world_size=ws, outcome=outcome,
                  detail=kw.pop("detail", ""), duration_s=0.1, **kw)


def sample_results():
    return [
        res("QUAL-1", "pass", ws=2),
        res("QUAL-1", "pass", ws=4),
        res("SPLIT-1", "fail", area="split", ws=2,
            detail="rank 1: split_group child bound to cuda:0, expected cuda:1",
            ranks=[RankOutcome(1, "error", status="timeout",
                               traceback="File \"split.py\", line 3, in wait_for_peer")]),
        res("HINT-1", "not-observable", area="hints", level="SHOULD", notes=["probe lacks observe:config"]),
        res("P2P-1", "error", area="p2p", level="SHOULD", detail="rank 0 timed out in recv"),
    ]


# --- verdict ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("outcomes", "interrupted", "expected"),
    [
        ([("MUST", "pass")], False, Verdict.CONFORMANT),
        ([("MUST", "pass")], True, Verdict.INCOMPLETE),
        ([("MUST", "fail")], True, Verdict.INCOMPLETE),
        ([("MUST", "pass"), ("MUST", "fail")], False, Verdict.NON_CONFORMANT),
        ([("MUST", "pass"), ("MUST", "error")], False, Verdict.NON_CONFORMANT),
        ([("MUST", "waived"), ("MUST", "fail")], False, Verdict.NON_CONFORMANT),
        ([("MUST", "pass"), ("MUST", "waived")], False, Verdict.CONFORMANT_WITH_WAIVERS),
        ([("MUST", "pass"), ("MUST", "skip"), ("MUST", "not-observable")], False, Verdict.CONFORMANT),
        ([("MUST", "pass"), ("SHOULD", "fail"), ("SHOULD", "error")], False, Verdict.CONFORMANT),
        ([("MUST", "waived"), ("SHOULD", "fail")], False, Verdict.CONFORMANT_WITH_WAIVERS),
        ([("MUST", "pass"), ("SHOULD", "waived")], False, Verdict.CONFORMANT),
        # nothing judged: every MUST skipped or not observable (e.g. nccl on a host without GPUs)
        ([("MUST", "skip"), ("MUST", "not-observable"), ("SHOULD", "pass")], False, Verdict.INCOMPLETE),
        ([], False, Verdict.INCOMPLETE),
    ],
)
def test_verdict(outcomes, interrupted, expected):
    results = [res(f"R{i}", o, level=lv) for i, (lv, o) in enumerate(outcomes)]
    assert compute_verdict(results, interrupted) == expected
    assert build_report("sim", results, ENV, interrupted=interrupted)["verdict"] == expected


# --- building and schema ---------------------------------------------------------------------

def test_built_report_validates_and_summarises():
    report = build_report("sim", sample_results(), ENV, started="2026-01-01T00:00:00+00:00")
    jsonschema.Draft202012Validator(schema()).validate(report)
    assert report["schema"] == "conformance-report/1"
    assert report["verdict"] == Verdict.NON_CONFORMANT
    summary = report["summary"]
    assert summary["total"] == 5
    assert summary["by_outcome"]["pass"] == 2 and summary["by_outcome"]["fail"] == 1
    assert summary["by_area"]["split"]["fail"] == 1
    assert summary["by_level"]["SHOULD"]["not-observable"] == 1
    assert summary["should_failures"] == [
        {"requirement": "P2P-1", "world_size": 2, "outcome": "error", "kind": "backend"}]
    assert report["started"] == "2026-01-01T00:00:00+00:00" and report["interrupted"] is False


def test_must_skips_are_counted():
    results = [res("A", "pass"), res("B", "skip"), res("C", "not-observable")]
    report = build_report("sim", results, ENV)
    assert report["verdict"] == Verdict.CONFORMANT
    assert report["summary"]["by_level"]["MUST"] == {
        "pass": 1, "fail": 0, "error": 0, "skip": 1, "not-observable": 1, "waived": 0,
    }


def test_bad_outcome_is_refused_by_the_record_and_by_the_schema():
    with pytest.raises(ValueError, match="'passed' is not a valid Outcome"):
        res(outcome="passed")
    report = build_report("sim", [res()], ENV)
    report["results"][0]["outcome"] = "passed"
    with pytest.raises(jsonschema.ValidationError):
        validate_report(report)


def test_waivers_used_derived_from_results():
    waiver = {"requirement": "A", "expected": "fail", "observed": "fail", "reason": "r", "issue": "https://x"}
    results = [res("A", "waived", ws=2, waiver=waiver), res("A", "waived", ws=4, waiver=waiver)]
    report = build_report("sim", results, ENV)
    assert report["waivers_used"] == [{"requirement": "A", "expected": "fail", "reason": "r", "issue": "https://x"}]


def test_collect_environment_on_cpu():
    env = collect_environment({"backend_package": "vendor-ccl 1.0"})
    for key in ("python", "torch", "torchcomms", "nccl", "driver", "gpu", "host", "suite", "spec"):
        assert key in env
    assert env["backend_package"] == "vendor-ccl 1.0"
    build_report("sim", [], env)  # the real environment validates


# --- digest ----------------------------------------------------------------------------------

def test_digest_detects_tampering():
    report = build_report("sim", sample_results(), ENV)
    assert verify_digest(report)
    tampered = json.loads(json.dumps(report))
    tampered["results"][2]["outcome"] = "pass"
    assert not verify_digest(tampered)
    assert not verify_digest({k: v for k, v in report.items() if k != "digest"})


def test_digest_matches_documented_one_liner(tmp_path):
    report = build_report("sim", sample_results(), ENV)
    json_path, _ = write_report(report, tmp_path)
    body = json.loads(json_path.read_text())
    digest = body.pop("digest")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert hashlib.sha256(canonical).hexdigest() == digest


# --- writing ---------------------------------------------------------------------------------

def test_write_and_load_roundtrip(tmp_path):
    report = build_report("sim", sample_results(), ENV)
    json_path, md_path = write_report(report, tmp_path / "new" / "dir")
    assert json_path.name == "sim.json" and md_path.name == "sim.md"
    loaded = load_report(json_path)
    assert loaded == report and verify_digest(loaded)
    assert md_path.read_text(encoding="utf-8") == render_markdown(report)
    assert sorted(p.name for p in json_path.parent.iterdir()) == ["sim.json", "sim.md"]


def test_load_report_rejects_invalid(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": "conformance-report/1"}))
    with pytest.raises(jsonschema.ValidationError):
        load_report(path)


def test_unserialisable_report_leaves_no_file(tmp_path):
    report = build_report("sim", sample_results(), ENV)
    report["environment"]["weird"] = float("nan")
    with pytest.raises(ValueError):
        write_report(report, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_failed_replace_cleans_temp_and_keeps_old_file(tmp_path, monkeypatch):
    old = build_report("sim", [res()], ENV)
    json_path, _ = write_report(old, tmp_path)
    before = json_path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_report(build_report("sim", sample_results(), ENV), tmp_path)
    assert json_path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.json", "sim.md"]


def test_target_name_is_made_file_safe(tmp_path):
    report = build_report("vendor:../x", [res()], ENV)
    json_path, _ = write_report(report, tmp_path)
    assert json_path.parent == tmp_path and json_path.name == "vendor_.._x.json"


# --- markdown --------------------------------------------------------------------------------

def test_markdown_matrix_and_findings():
    waiver = {"requirement": "W-1", "expected": "fail", "observed": "fail",
              "reason": "known defect", "issue": "https://example.org/1"}
    results = [*sample_results(), res("W-1", "waived", area="hints", ws=4, waiver=waiver)]
    stale = [{"requirement": "S-1", "issue": "https://example.org/2",
              "message": "S-1 now passes at world size 2: the waiver is stale and can be removed"}]
    report = build_report("gloo", results, ENV, stale_waivers=stale)
    md = render_markdown(report, statements={"SPLIT-1": "split_group binds to the parent | device"})
    assert md.startswith("# Conformance report: gloo — ❌ non-conformant")
    assert "| Requirement | Level | Statement | ws=2 | ws=4 |" in md
    assert "| `QUAL-1` | MUST |  | ✅ pass | ✅ pass |" in md
    assert "| `SPLIT-1` | MUST | split_group binds to the parent \\| device | ❌ fail | — |" in md
    assert "👁 n/o" in md and "🛈 waived" in md and "⚠️ error" in md
    assert md.index("### hints") < md.index("### qualification") < md.index("### split")
    findings = md[md.index("## Failures"):]
    assert "rank 1: split_group child bound to cuda:0, expected cuda:1" in findings
    assert "rank 1 (timeout), last frames:" in findings and "in wait_for_peer" in findings
    assert "rank 0 timed out in recv" in findings
    assert "known defect (https://example.org/1)" in findings
    assert "S-1 now passes" in findings
    assert "probe lacks observe:config" in findings
    # the summary comes first, and each failure has a command running just it
    assert md.index("## Summary") < md.index("## Failures") < md.index("## Matrix") < md.index("## Environment")
    assert "Reproduce: `python -m conformance run --target gloo --requirement SPLIT-1 --world-sizes 2" in md


def test_markdown_interrupted_and_empty():
    md = render_markdown(build_report("sim", [], ENV, interrupted=True))
    assert "⏸ incomplete" in md and "interrupted" in md and "No backend MUST failures or errors." in md

