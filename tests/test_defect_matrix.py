"""The defect matrix: 100% both ways and a clean simulator passing every MUST (runs the whole matrix)."""

import json
from pathlib import Path

import pytest

from conformance.defect_matrix import build_matrix, run_matrix


def test_build_matrix_flags_uncaught_defects_and_toothless_requirements() -> None:
    clean = {"A": "pass", "B": "pass", "C": "fail"}
    matrix = build_matrix(clean, {"d1": {"A": "fail", "B": "pass", "C": "fail"}, "d2": clean},
                          {"A": "MUST", "B": "MUST", "C": "SHOULD"})
    assert matrix["uncaught_mutants"] == ["d2"]
    assert matrix["requirements_without_teeth"] == ["B"]
    assert matrix["not_judged_on_sim"] == {"C": "fail"}
    fixed = build_matrix(clean, {"d1": {"A": "fail", "B": "pass", "C": "fail"}},
                         {"A": "MUST", "B": "SHOULD", "C": "SHOULD"}, frozenset({"B"}))
    assert fixed["requirements_without_teeth"] == [] and fixed["fixed_upstream"] == ["B"]
    assert fixed["teeth_rate"] == 1.0


@pytest.mark.slow
def test_every_defect_caught_every_requirement_has_teeth(tmp_path: Path) -> None:
    code = run_matrix([2, 4], tmp_path, timeout_s=8.0)  # headroom: CI runs this beside other tests on 2 cores
    matrix = json.loads((tmp_path / "defects.json").read_text())
    verdicts = {k: matrix[k] for k in ("uncaught_mutants", "requirements_without_teeth", "clean_must_failures")}
    assert code == 0, f"{verdicts}; clean outcomes: {matrix['clean']}"
    assert matrix["kill_rate"] == 1.0 and matrix["teeth_rate"] == 1.0
    assert "| defect | caught by |" in (tmp_path / "defects.md").read_text()
