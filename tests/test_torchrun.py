"""The torchrun launcher end to end: torchrun starts the ranks, each runs the checks in-process, rank 0 reports."""

import json
import subprocess
import sys
from pathlib import Path

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
            "--local-addr", "127.0.0.1", "--nnodes", "1", "--nproc-per-node", "2"]


def _run(tmp_path: Path, *extra: str) -> tuple[int, dict]:
    cmd = [*TORCHRUN, "-m", "conformance", "run", "--target", "sim", "--launcher", "env", "--area", "split",
           "--report-dir", str(tmp_path), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    report = tmp_path / "sim.json"
    assert report.exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads(report.read_text())


def test_torchrun_ranks_run_the_suite_and_rank0_reports(tmp_path: Path) -> None:
    code, report = _run(tmp_path)
    assert code == 0 and report["verdict"] == "conformant"
    assert {r["world_size"] for r in report["results"]} == {2}
    assert {r["area"] for r in report["results"]} == {"split"}


def test_torchrun_reports_a_planted_defect_naming_the_rank(tmp_path: Path) -> None:
    code, report = _run(tmp_path, "--target-option", "defects=split_child_unbound",
                        "--requirement", "SPLIT-BOUND-INHERIT")
    (result,) = report["results"]
    assert code != 0  # rank 0 exits 1 (non-conformant), so torchrun reports the job failed
    assert report["verdict"] == "non-conformant" and result["outcome"] == "fail"
    assert result["detail"] == "ranks 0, 1: child communicator's device: expected 'cpu:0', observed None"
