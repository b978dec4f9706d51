"""Bad input is refused before anything runs: exit 2 (pytest: a usage error), one line naming the value."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import conformance.report.expectations as expectations_mod
import conformance.session as session
from conformance.cli import main
from conformance.runner import pool as pool_mod
from conformance.spec import load_catalog

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_pool(monkeypatch):
    """Fail the test if anything starts a rank pool: bad input must be refused before that."""
    def refuse(*args, **kwargs):
        raise AssertionError("a rank pool was started for a run that should have been refused")
    monkeypatch.setattr(pool_mod.RankPool, "__init__", refuse)


def _refused(argv: list[str], capsys) -> str:
    """Run the CLI; assert exit 2 and a single line of error; return that line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def _run(tmp_path: Path, *extra: str) -> list[str]:
    return ["run", "--target", "sim", "--world-sizes", "2", "--requirement", "SPLIT-MEMBERSHIP",
            "--report-dir", str(tmp_path / "r"), *extra]


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5", "soon"])
@pytest.mark.parametrize("command", ["run", "defects"])
def test_bad_timeout(value, command, tmp_path, capsys, no_pool) -> None:
    argv = _run(tmp_path) if command == "run" else ["defects", "--report-dir", str(tmp_path)]
    line = _refused([*argv, f"--timeout={value}"], capsys)
    assert "--timeout" in line and repr(value) in line


@pytest.mark.parametrize(("sizes", "says"), [("2,1000", "world size 1000"),
                                             ("0", "positive, got 0")])
def test_bad_world_sizes(sizes, says, tmp_path, capsys, no_pool) -> None:
    line = _refused([*_run(tmp_path), "--world-sizes", sizes], capsys)
    assert says in line


@pytest.mark.parametrize("command", ["run", "defects"])
def test_report_dir_that_is_a_file(command, tmp_path, capsys, no_pool) -> None:
    file = tmp_path / "afile"
    file.write_text("x")
    argv = _run(tmp_path) if command == "run" else ["defects"]
    line = _refused([*argv, "--report-dir", str(file)], capsys)
    assert str(file) in line and "not a directory" in line


@pytest.mark.parametrize(("text", "first_catch", "says"), [
    ("{}", True, "not a defects.json the matrix wrote"),
    ("not json", True, "not a defects.json the matrix wrote"),
    ('{"mutants": {}}', False, "give both or neither")])
def test_bad_defects_order_from(text, first_catch, says, tmp_path, capsys, no_pool) -> None:
    earlier = tmp_path / "earlier.json"
    earlier.write_text(text)
    argv = ["defects", "--report-dir", str(tmp_path / "r"), "--order-from", str(earlier)]
    line = _refused([*argv, *(["--first-catch"] if first_catch else [])], capsys)
    assert "--order-from" in line and says in line


def test_report_dir_that_cannot_be_created(tmp_path, capsys, no_pool) -> None:
    line = _refused([*_run(tmp_path), "--report-dir", "/proc/cfm-no-such-dir/reports"], capsys)
    assert "/proc/cfm-no-such-dir/reports" in line and "not writable" in line


def test_malformed_expectations_file(tmp_path, monkeypatch, capsys, no_pool) -> None:
    (tmp_path / "sim.toml").write_text("[[expect]]\nrequirement = 'SPLIT-MEMBERSHIP'\noutcome = 'bogus'\n")
    monkeypatch.setattr(expectations_mod, "EXPECTATIONS_DIR", tmp_path)
    line = _refused(_run(tmp_path), capsys)
    assert "sim.toml" in line and "bogus" in line


def test_unknown_requirement_in_expectations_file(tmp_path, monkeypatch, capsys, no_pool) -> None:
    (tmp_path / "sim.toml").write_text(
        "[[expect]]\nrequirement = 'SPLIT-MEMBERSHIPP'\noutcome = 'fail'\nreason = 'a typo'\n"
        "issue = 'https://example.org/1'\n")
    monkeypatch.setattr(expectations_mod, "EXPECTATIONS_DIR", tmp_path)
    line = _refused(_run(tmp_path), capsys)
    assert "SPLIT-MEMBERSHIPP" in line and "no such requirement" in line


def test_capability_typo_in_the_spec(tmp_path, monkeypatch, capsys, no_pool) -> None:
    catalog = load_catalog()
    typo = [dataclasses.replace(r, capabilities=("splitt",)) if r.id == "SPLIT-MEMBERSHIP" else r for r in catalog]
    monkeypatch.setattr(session, "load_catalog", lambda: list(typo))
    line = _refused(_run(tmp_path), capsys)
    assert "SPLIT-MEMBERSHIP" in line and "'splitt'" in line


@pytest.mark.parametrize(("option", "says"), [("--conformance-targets=simm", "unknown target 'simm'"),
                                              ("--conformance-world-sizes=0", "positive, got 0"),
                                              ("--conformance-timeout=nan", "'nan'")])
def test_pytest_options_are_usage_errors(option, says) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                           "conformance/suite", "-k", "SPLIT-MEMBERSHIP", option],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 4, proc.stdout[-1500:] + proc.stderr[-1500:]  # pytest.ExitCode.USAGE_ERROR
    assert says in proc.stderr
    assert "passed" not in proc.stdout and "failed" not in proc.stdout


def test_world_size_one_skips_what_needs_two_ranks(tmp_path, capsys, no_pool) -> None:
    """World size 1 is accepted (single-GPU hosts), but nothing that needs peers runs: the run is incomplete."""
    code = main(["run", "--target", "sim", "--world-sizes", "1", "--area", "p2p", "--report-dir", str(tmp_path)])
    report = json.loads((tmp_path / "sim.json").read_text())
    assert code == 3 and report["verdict"] == "incomplete"
    assert {r["outcome"] for r in report["results"]} == {"skip"}
    assert any("needs at least 2 ranks" in r["detail"] for r in report["results"])
