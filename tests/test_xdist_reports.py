"""Under pytest-xdist only the controller writes a report, with every worker's results; a run stopped early
(Ctrl-C, --maxfail) is marked interrupted, never given a verdict over part of the items."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conformance.report import load_report

ROOT = Path(__file__).resolve().parents[1]


def _pytest(tmp_path: Path, *extra: str, env: dict[str, str] | None = None
            ) -> tuple[subprocess.CompletedProcess, list[str]]:
    spy = tmp_path / "writes.log"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.xdist_write_spy", "-n", "2",
         "conformance/suite", "--conformance-targets=sim", "--conformance-world-sizes=2",
         f"--conformance-report-dir={tmp_path / 'reports'}", *extra],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
        env={**os.environ, **(env or {}), "CFM_WRITE_SPY": str(spy)})
    return proc, spy.read_text().splitlines() if spy.exists() else []


def test_only_the_controller_writes_the_report_with_every_result(tmp_path: Path) -> None:
    proc, writes = _pytest(tmp_path, "-k", "SPLIT-MEMBERSHIP or SPLIT-VALIDATION or SPLIT-UNBOUND or SPLIT-TIMEOUT")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert [w.split()[0] for w in writes] == ["controller"], writes
    report = load_report(tmp_path / "reports" / "sim.json")
    assert report["interrupted"] is False and report["verdict"] == "conformant"
    summary = re.findall(r"(\d+) (passed|skipped|xfailed|xpassed|failed)", proc.stdout.strip().splitlines()[-1])
    assert len(report["results"]) == sum(int(n) for n, _ in summary) > 0


def test_a_run_stopped_early_is_marked_interrupted(tmp_path: Path) -> None:
    # An injected fault makes the first check with an allreduce an error; --maxfail stops the run there.
    proc, writes = _pytest(tmp_path, "-k", "COAL or SPLIT", "--maxfail=1", env={"SIM_FAULT": "0:allreduce:raise"})
    assert proc.returncode in (1, 2), proc.stdout[-2000:]  # failed, or xdist's "interrupted" after --maxfail
    assert [w.split()[0] for w in writes] == ["controller"], writes
    report = load_report(tmp_path / "reports" / "sim.json")
    assert report["interrupted"] is True and report["verdict"] == "incomplete"
