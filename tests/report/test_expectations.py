from pathlib import Path

import pytest

from conformance.report import (
    Result,
    StaleWaiverError,
    apply_expectations,
    build_report,
    load_expectations,
    out_of_range,
)
from conformance.report.expectations import EXPECTATIONS_DIR, Expectation
from conformance.spec import SpecError

ENTRY = """
[[expect]]
requirement = "HINT-X"
outcome = "fail"
reason = "Options are dropped."
issue = "https://github.com/pytorch/pytorch/pull/1"
"""


def res(rid="HINT-X", outcome="fail", ws=2, level="MUST"):
    return Result(requirement=rid, area="hints", level=level, world_size=ws, outcome=outcome,
                  detail="rank 0: expected option seen, got default", duration_s=0.0)


def write(tmp_path: Path, text: str, target="vendor") -> Path:
    (tmp_path / f"{target}.toml").write_text(text)
    return tmp_path


# --- loading ---------------------------------------------------------------------------------

def test_shipped_files_load():
    nccl = {e.requirement: e for e in load_expectations("nccl")}  # seen on an H200, torch 2.11, world size 1
    assert set(nccl) == {"API-LIFECYCLE", "COLL-NONCONTIGUOUS", "HINT-INVALID-REFUSED", "HINT-NEWGROUP-OPTIONS"}
    assert nccl["API-LIFECYCLE"].world_sizes == (1,) and nccl["API-LIFECYCLE"].torch == ">=2.11,<2.12"
    gloo = {e.requirement for e in load_expectations("gloo")}
    assert gloo == {"P2P-PEER-OUTSIDE", "P2P-MISMATCH", "COLL-NONCONTIGUOUS", "P2P-DATA", "COAL-SYNC-RESULTS",
                    "API-WORK-FUTURE", "COLL-ALLTOALL-UNEVEN", "API-OP-PROGRAMS", "COLL-ABSENT-PEER"}
    (entry,) = load_expectations("torchcomms")
    assert entry.requirement == "HINT-TORCHCOMMS-OPTIONS" and entry.outcome == "fail"
    assert entry.issue == "https://github.com/pytorch/pytorch/pull/187856"
    assert entry.torch == ">=2.13,<2.14"
    shipped = sorted(p.name for p in EXPECTATIONS_DIR.glob("*.toml"))
    assert shipped == ["gloo.toml", "nccl.toml", "torchcomms.toml"]


def test_missing_and_empty_files(tmp_path):
    assert load_expectations("absent", tmp_path) == []
    assert load_expectations("vendor", write(tmp_path, "# header only\n")) == []
    assert load_expectations("vendor", write(tmp_path, "expect = []\n")) == []


def test_loads_entry_with_filters(tmp_path):
    text = ENTRY + 'world_sizes = [2, 4]\ntorch = ">=2.13,<2.14"\n'
    (entry,) = load_expectations("vendor", write(tmp_path, text))
    url = "https://github.com/pytorch/pytorch/pull/1"
    rng = ">=2.13,<2.14"
    expected = Expectation("HINT-X", "fail", "Options are dropped.", url, (2, 4), rng, "vendor.toml")
    assert entry == expected


@pytest.mark.parametrize(
    ("edit", "requirement", "field"),
    [
        (lambda t: t.replace('outcome = "fail"', 'outcome = "pass"'), "HINT-X", "outcome"),
        (lambda t: t.replace('reason = "Options are dropped."\n', ""), "HINT-X", "reason"),
        (lambda t: t.replace('reason = "Options are dropped."', 'reason = "  "'), "HINT-X", "reason"),
        (lambda t: t.replace("https://github.com/pytorch/pytorch/pull/1", "PR 1"), "HINT-X", "issue"),
        (lambda t: t.replace('requirement = "HINT-X"\n', ""), "#0", "requirement"),
        (lambda t: t + "world_sizes = [0]\n", "HINT-X", "world_sizes"),
        (lambda t: t + 'world_sizes = "2"\n', "HINT-X", "world_sizes"),
        (lambda t: t + 'torch = "2.13 or later"\n', "HINT-X", "torch"),
        (lambda t: t + "torch = 2.13\n", "HINT-X", "torch"),
        (lambda t: t + 'ticket = "x"\n', "HINT-X", "ticket"),
        (lambda t: t + t, "HINT-X", "world_sizes"),
        (lambda t: t + "[expect.sub]\n", "HINT-X", "sub"),
        (lambda t: "expect = 3\n", "<file>", "expect"),
        (lambda t: t + "[other]\n", "<file>", "other"),
        (lambda t: t + "[[expect]\n", "<file>", "<toml>"),
    ],
)
def test_load_errors_name_file_requirement_field(tmp_path, edit, requirement, field):
    with pytest.raises(SpecError) as info:
        load_expectations("vendor", write(tmp_path, edit(ENTRY)))
    err = info.value
    assert (err.file, err.requirement, err.field) == ("vendor.toml", requirement, field)
    assert "vendor.toml" in str(err) and field in str(err)


def test_same_requirement_on_disjoint_world_sizes_is_allowed(tmp_path):
    text = ENTRY + "world_sizes = [2]\n" + ENTRY + "world_sizes = [4]\n"
    assert len(load_expectations("vendor", write(tmp_path, text))) == 2


# --- applying --------------------------------------------------------------------------------

def entry(**kw):
    base = {"requirement": "HINT-X", "outcome": "fail", "reason": "Options are dropped.",
            "issue": "https://example.org/1", "file": "vendor.toml"}
    return Expectation(**{**base, **kw})


def test_waived_fail_is_waived_not_pass():
    original = res()
    (out,), stale = apply_expectations([original], [entry()], strict=True, torch_version="2.13.0")
    assert out.outcome == "waived" and stale == []
    assert out.waiver == {"requirement": "HINT-X", "expected": "fail", "observed": "fail",
                          "reason": "Options are dropped.", "issue": "https://example.org/1"}
    assert original.outcome == "fail"  # inputs are not mutated
    report = build_report("vendor", [out], {"python": "3", "torch": "2.13", "torchcomms": None, "nccl": None,
                                             "suite": "0", "spec": "1", "host": "h"})
    assert report["verdict"] == "conformant-with-waivers"
    assert report["summary"]["by_outcome"]["waived"] == 1 and report["summary"]["by_outcome"]["pass"] == 0
    assert report["waivers_used"][0]["issue"] == "https://example.org/1"


def test_error_waived_only_by_error_entry():
    (out,), _ = apply_expectations([res(outcome="error")], [entry(outcome="error")], torch_version="2.13.0")
    assert out.outcome == "waived" and out.waiver["observed"] == "error"
    (out,), _ = apply_expectations([res(outcome="error")], [entry()], torch_version="2.13.0")
    assert out.outcome == "error" and out.waiver is None
    assert "waiver expects fail but observed error" in out.notes[0]


def test_not_observable_expectation_annotates_only():
    (out,), stale = apply_expectations([res(outcome="not-observable")], [entry(outcome="not-observable")],
                                       torch_version="2.13.0")
    assert out.outcome == "not-observable" and out.waiver is None and stale == []
    assert "Options are dropped." in out.notes[0]


def test_stale_waiver_reported():
    results = [res(outcome="pass", ws=2), res(outcome="pass", ws=4), res("OTHER", "fail")]
    out, stale = apply_expectations(results, [entry()], strict=False, torch_version="2.13.0")
    assert [r.outcome for r in out] == ["pass", "pass", "fail"]
    assert [item["world_size"] for item in stale] == [2, 4]
    item = stale[0]
    assert item["requirement"] == "HINT-X"
    assert "can be removed" in item["message"] and "vendor.toml" in item["message"]


def test_a_waiver_still_failing_at_another_world_size_is_not_stale():
    # gloo at world sizes 1,2: a coalescing bug needs two ranks, so world size 1 passes under the waiver
    results = [res(outcome="pass", ws=1), res(outcome="fail", ws=2)]
    out, stale = apply_expectations(results, [entry()], strict=True, torch_version="2.13.0")
    assert [r.outcome for r in out] == ["pass", "waived"] and stale == []


def test_stale_waiver_strict_raises():
    with pytest.raises(StaleWaiverError) as info:
        apply_expectations([res(outcome="pass")], [entry()], strict=True, torch_version="2.13.0")
    assert info.value.stale[0]["requirement"] == "HINT-X"
    assert info.value.results[0].outcome == "pass"
    assert "can be removed" in str(info.value)


def test_world_size_filter():
    results = [res(ws=2), res(ws=4)]
    out, _ = apply_expectations(results, [entry(world_sizes=(4,))], torch_version="2.13.0")
    assert [r.outcome for r in out] == ["fail", "waived"]


@pytest.mark.parametrize(("version", "expected"), [("2.13.0+cpu", "waived"), ("2.13.1", "waived"),
                                                   ("2.14.0", "fail"), ("2.12.0", "fail")])
def test_torch_filter(version, expected):
    (out,), stale = apply_expectations([res()], [entry(torch=">=2.13,<2.14")], torch_version=version)
    assert out.outcome == expected and stale == []


def test_torch_filter_skips_stale_outside_range():
    entries = [entry(torch=">=2.13,<2.14")]
    _, stale = apply_expectations([res(outcome="pass")], entries, torch_version="2.14.0")
    assert stale == []


@pytest.mark.parametrize("outcome", ["fail", "pass"])
def test_waiver_out_of_torch_range_is_reported_not_dropped(outcome):
    entries = [entry(torch=">=2.13,<2.14")]
    (out,), stale = apply_expectations([res(outcome=outcome)], entries, torch_version="2.15.0+cu132")
    assert out.outcome == outcome and stale == []
    assert out.notes == ["waiver out of range: it covers torch >=2.13,<2.14, not 2.15.0+cu132; not applied "
                         "(https://example.org/1)"]
    (listed,) = out_of_range(entries, "2.15.0+cu132")
    assert listed["requirement"] == "HINT-X" and listed["running_torch"] == "2.15.0+cu132"
    assert "covers torch >=2.13,<2.14, not 2.15.0+cu132" in listed["message"]
    assert out_of_range(entries, "2.13.0") == []
    report = build_report("vendor", [out], {"python": "3", "torch": "2.15.0", "torchcomms": None, "nccl": None,
                                            "suite": "0", "spec": "1", "host": "h"},
                          out_of_range_waivers=[listed])
    assert report["out_of_range_waivers"] == [listed]


def test_skip_is_neither_waived_nor_stale():
    (out,), stale = apply_expectations([res(outcome="skip")], [entry()], torch_version="2.13.0")
    assert out.outcome == "skip" and out.notes == [] and stale == []
