"""SIM_FAULT: fires once per run (not again in a rebuilt pool); unknown ops and malformed values refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli import main
from simulator import faults


@pytest.mark.parametrize(("value", "says"), [
    ("1:split:raise", "unknown op 'split'"),
    ("0:init:exit", "unknown op 'init'"),
    ("1:allreduce:explode", "unknown fault kind 'explode'"),
    ("allreduce:raise", "expected <rank>:<op>:<kind>"),
    ("x:allreduce:raise", "expected <rank>:<op>:<kind>"),
    ("1:allreduce:raise:extra", "expected <rank>:<op>:<kind>"),
])
def test_malformed_sim_fault_is_refused_before_the_run(value, says, monkeypatch, tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="SIM_FAULT"):
        faults.parse(value)
    monkeypatch.setenv("SIM_FAULT", value)
    code = main(["run", "--target", "sim", "--world-sizes", "2", "--requirement", "SPLIT-MEMBERSHIP",
                 "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and says in err and value in err, err
    assert not (tmp_path / "sim.json").exists()


def test_a_crash_fault_fires_once_per_run(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SIM_FAULT", "1:allreduce:sigkill")
    main(["run", "--target", "sim", "--world-sizes", "2", "--area", "coalescing", "--timeout", "10",
          "--report-dir", str(tmp_path)])
    results = json.loads((tmp_path / "sim.json").read_text())["results"]
    errors = [r for r in results if r["outcome"] == "error"]
    assert len(errors) == 1, [(r["requirement"], r["detail"][:100]) for r in errors]
    assert "SIGKILL" in errors[0]["detail"]
    assert sum(r["outcome"] == "pass" for r in results) >= 3
