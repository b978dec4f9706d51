"""The fidelity job's fast subset: torch's own tests that failed on the simulator before its fixes, run by the
job's worker on the simulator at world size 2, plus the job's comparison logic.

The worker must also see a failure when there is one: torch's monitored_barrier test fails on any backend but
gloo (torch's front end refuses it), and the worker reports that, with torch's words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from conformance.fidelity.job import passed, verdict
from conformance.fidelity.selection import load

FORMERLY_FAILING = [
    "test_batch_isend_irecv_gloo",  # deadlocked: torch < 2.14 handed the batch over op by op
    "test_send_recv_any_source",  # refused on a lazily initialised world
    "test_barrier_timeout_full_group",  # timeout message matched none of torch's words
    "test_ddp_create_graph",  # reduction into grads that require grad, with grad mode on in the stream
]
REFUSED = "test_monitored_barrier_gloo"


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("fidelity") / "sim.jsonl"
    proc = subprocess.run([sys.executable, "-m", "conformance.fidelity.worker", "--backend", "sim",
                           "--world-size", "2", "--out", str(out), *FORMERLY_FAILING, REFUSED],
                          env={**os.environ, "FIDELITY_START_METHOD": "fork"}, check=False,
                          capture_output=True, text=True, timeout=240)
    lines = [json.loads(ln) for ln in Path(out).read_text().splitlines()]
    assert lines and lines[0] == {"control": {"leak_probe_sees_segments": True}}, (lines[:1], proc.stderr[-2000:])
    return {r["test"]: r for r in lines[1:]}


@pytest.mark.parametrize("test", FORMERLY_FAILING)
def test_formerly_failing_upstream_test_passes_on_the_simulator(records: dict[str, dict], test: str) -> None:
    rec = records[test]
    assert rec["outcome"] == "pass", f"{test} on the simulator (world size 2): expected pass, observed " \
        f"{rec['outcome']}: {rec.get('message')}\n{rec.get('detail', '')[-1500:]}"
    assert not rec.get("leaked_segments"), f"{test}: segments left in /dev/shm: {rec['leaked_segments']}"


def test_the_worker_reports_torchs_refusal_of_a_gloo_only_test(records: dict[str, dict]) -> None:
    # torch's words: "... only implemented for GLOO backend." up to 2.13 (v2.13.0 distributed_c10d.py:5419),
    # "... requires a group with a CPU-capable backend (e.g. GLOO)." from 2.14
    words = "only implemented for GLOO" if Version(torch.__version__) < Version("2.14") else "CPU-capable backend"
    rec = records[REFUSED]
    assert rec["outcome"] == "fail" and words in rec["message"], rec


def test_verdicts_and_the_job_result() -> None:
    sel = load()
    ok, bad, skip = {"outcome": "pass"}, {"outcome": "fail", "message": "x"}, {"outcome": "skip", "message": "gpu"}
    assert verdict(sel, "test_all_reduce_sum", ok, ok) == "match"
    assert verdict(sel, "test_all_reduce_sum", ok, bad) == "sim-fail"
    assert verdict(sel, "test_all_reduce_sum", ok, None) == "sim-fail"
    assert verdict(sel, "test_all_reduce_sum", skip, None) == "gloo-skip"
    assert verdict(sel, "test_all_reduce_sum", bad, ok) == "gloo-fail"
    assert verdict(sel, REFUSED, ok, bad) == "gloo-only"
    row = {"test": "t", "gloo": ok, "sim": ok, "verdict": "match"}
    report = {"world_sizes": [{"world_size": 2, "rows": [row], "leak_probe_sees_segments": True}]}
    assert passed(report)
    assert not passed({"world_sizes": [{"world_size": 2, "rows": [{**row, "verdict": "sim-fail"}],
                                        "leak_probe_sees_segments": True}]})
    leaky = {**row, "sim": {"outcome": "pass", "leaked_segments": ["simx"]}}
    assert not passed({"world_sizes": [{"world_size": 2, "rows": [leaky], "leak_probe_sees_segments": True}]})
    assert not passed({"world_sizes": [{"world_size": 2, "rows": [row], "leak_probe_sees_segments": False}]})


def test_every_gloo_only_test_is_selected_and_has_a_reason(tmp_path: Path) -> None:
    sel = load()
    for group in sel.gloo_only.values():
        assert group.reason and group.source and set(group.tests) <= set(sel.tests)
    bad = tmp_path / "sel.toml"
    bad.write_text('[areas]\na = ["test_x"]\n[gloo_only.g]\ntests = ["test_y"]\nreason = "r"\nsource = ["s"]\n')
    with pytest.raises(ValueError, match="test_y"):
        load(bad)
