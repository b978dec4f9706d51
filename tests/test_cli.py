"""The CLI: list, bad input, a small run writing reports with the right exit code."""

import json
import subprocess
import sys
from pathlib import Path

from conformance.cli import main


def test_list_names_every_requirement(capsys) -> None:
    assert main(["list"]) == 0
    assert "SPLIT-PARTIAL-NONMEMBER" in capsys.readouterr().out


def test_bad_world_sizes_and_unknown_requirement_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--target", "sim", "--world-sizes", "two"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "world sizes" in proc.stderr
    assert main(["run", "--target", "sim", "--requirement", "NOPE-1", "--report-dir", str(tmp_path)]) == 2


def test_run_writes_json_and_markdown(tmp_path: Path) -> None:
    code = main(["run", "--target", "sim", "--world-sizes", "2", "--area", "split", "--report-dir", str(tmp_path)])
    report = json.loads((tmp_path / "sim.json").read_text())
    assert code == 0 and report["verdict"] == "conformant"
    assert report["schema"] == "conformance-report/1"
    assert {r["area"] for r in report["results"]} == {"split"}
    assert "SPLIT-MEMBERSHIP" in (tmp_path / "sim.md").read_text()


def test_a_planted_defect_makes_the_run_non_conformant(tmp_path: Path) -> None:
    code = main(["run", "--target", "sim", "--target-option", "defects=avg_as_sum", "--world-sizes", "2",
                 "--requirement", "COLL-ALLREDUCE-OPS", "--report-dir", str(tmp_path)])
    report = json.loads((tmp_path / "sim.json").read_text())
    assert code == 1 and report["verdict"] == "non-conformant"
    assert ("all_reduce AVG of float32[7] over members [0, 1]: 6 of 7 elements differ; at [0, 1, 2, 3]: "
            "expected [-2.5, 2.5, -1.5, -1.0], observed [-5.0, 5.0, -3.0, -2.0]") in report["results"][0]["detail"]


def test_progress_prints_a_detail_that_looks_like_rich_markup(capsys) -> None:
    """A failure detail naming ``[/path:line]`` is printed as text, not parsed as a closing tag."""
    from conformance.cli import _progress
    from conformance.report import Result

    detail = "rank 0: refused at [/usr/lib/torch/distributed_c10d.py:2014] with [bold]"
    _progress(1)(Result("SPLIT-MEMBERSHIP", "split", "MUST", 2, "fail", detail, 0.1))
    assert "[/usr/lib/torch/distributed_c10d.py:2014]" in capsys.readouterr().err
