"""Under torchrun a check that kills a rank's process costs that check, not the run (issue 26, item 7).

The backend (tests/gpu/crashing_backend.py) is toyccl whose rank 1 dies of SIGSEGV in barrier(): the
barrier check is reported as an error naming rank 1 and the signal, and the checks before and after it
keep their results. Before the supervised runner, torchrun tore the job down at the segfault and no
report was written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
            "--local-addr", "127.0.0.1", "--nnodes", "1", "--nproc-per-node", "2"]
ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_a_crashing_check_costs_that_check_only(tmp_path: Path) -> None:
    cmd = [*TORCHRUN, "-m", "conformance", "run", "--target", "vendor", "--launcher", "env",
           "--target-option", "backend=toyccl_barrier_segv", "--target-option", "device=cpu",
           "--target-option", "module=tests.gpu.crashing_backend",
           "--requirement", "COLL-ROOTED,COLL-BARRIER-BLOCKS,COLL-ALLTOALL-UNEVEN", "--timeout", "20",
           "--budget", "0", "--report-dir", str(tmp_path)]  # boundary cases only: the crash is under test, not data
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False, cwd=ROOT)
    report = tmp_path / "toyccl_barrier_segv.json"  # a vendor target's report is named by its backend
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    results = {r["requirement"]: r for r in json.loads(report.read_text())["results"]}
    assert {k: r["outcome"] for k, r in results.items()} == {
        "COLL-ROOTED": "pass", "COLL-BARRIER-BLOCKS": "error", "COLL-ALLTOALL-UNEVEN": "pass"}
    assert "rank 1 crashed: killed by signal SIGSEGV" in results["COLL-BARRIER-BLOCKS"]["detail"]
    # the check after the crash starts on every rank together: rank 1 did not wait out rank 0's 20 s in it
    assert results["COLL-ALLTOALL-UNEVEN"]["duration_s"] < 15, results["COLL-ALLTOALL-UNEVEN"]["duration_s"]
    crashed = next(r for r in results["COLL-BARRIER-BLOCKS"]["ranks"] if r["rank"] == 1)
    assert crashed["status"] == "crashed" and crashed["exitcode"] == -11
    # the Python stack faulthandler wrote at the crash, headed with the job's rank
    assert crashed["traceback"].startswith("Python stacks of rank 1 (pid") and "barrier" in crashed["traceback"]
