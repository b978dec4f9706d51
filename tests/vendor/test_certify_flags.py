"""certify's declaration flags: --capability, --capabilities-file, --options-factory; declared means verified."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cli import main

SHIPPED = Path(__file__).resolve().parents[2] / "examples" / "toyccl" / "capabilities.toml"

pytest.importorskip("toyccl", reason="examples/toyccl is not installed (pip install ./examples/toyccl)")


def _certify(tmp_path: Path, *flags: str) -> tuple[int, dict | None]:
    code = main(["certify", "--backend", "toyccl", "--import", "toyccl", "--world-sizes", "2",
                 "--requirement", "SPLIT-MEMBERSHIP,HINT-NEWGROUP-OPTIONS", "--report-dir", str(tmp_path), *flags])
    path = tmp_path / "toyccl.json"
    return code, json.loads(path.read_text()) if path.exists() else None


def _outcomes(report: dict) -> dict[str, str]:
    return {r["requirement"]: r["outcome"] for r in report["results"]}


def test_capabilities_file_and_factory_make_the_checks_run(tmp_path: Path) -> None:
    caps = tmp_path / "caps.toml"
    caps.write_text('capabilities = ["device_binding", "split", "options"]\n'
                    'options_factory = "toyccl.options:ToyOptions"\n')
    code, report = _certify(tmp_path, "--capabilities-file", str(caps))
    assert code == 0 and _outcomes(report) == {"SPLIT-MEMBERSHIP": "pass", "HINT-NEWGROUP-OPTIONS": "pass"}
    assert report["summary"]["judged"]["judged"] == 2


def test_the_shipped_capabilities_file_is_valid(tmp_path: Path) -> None:
    code, report = _certify(tmp_path, "--capabilities-file", str(SHIPPED))
    assert code == 0 and set(_outcomes(report).values()) == {"pass"}


def test_undeclared_capabilities_are_skipped_and_listed_as_unjudged(tmp_path: Path) -> None:
    code, report = _certify(tmp_path)
    assert _outcomes(report) == {"SPLIT-MEMBERSHIP": "skip", "HINT-NEWGROUP-OPTIONS": "skip"}
    unjudged = {u["requirement"]: u["missing"] for u in report["summary"]["judged"]["unjudged"]}
    assert unjudged == {"SPLIT-MEMBERSHIP": ["split"], "HINT-NEWGROUP-OPTIONS": ["options"]}
    assert code == 3  # nothing judged: incomplete


def test_a_declared_capability_that_cannot_run_fails(tmp_path: Path) -> None:
    """split declared on cpu without device_binding: torch cannot split an unbound world, so it is a FAIL."""
    code, report = _certify(tmp_path, "--capability", "split")
    result = next(r for r in report["results"] if r["requirement"] == "SPLIT-MEMBERSHIP")
    assert result["outcome"] == "fail" and "declared capability split" in result["detail"]
    assert code == 1 and report["verdict"] == "non-conformant"


@pytest.mark.parametrize(("content", "says"), [
    ('capabilities = ["splitting"]\n', "unknown capabilities"),
    ('capability = ["split"]\n', "unknown keys"),
    ("capabilities = [\n", "capabilities-file"),
])
def test_bad_capabilities_file_is_exit_2(tmp_path: Path, capsys, content: str, says: str) -> None:
    caps = tmp_path / "caps.toml"
    caps.write_text(content)
    code, report = _certify(tmp_path, "--capabilities-file", str(caps))
    assert code == 2 and report is None
    assert says in " ".join(capsys.readouterr().err.split())  # rich wraps long lines


def test_certify_help_lists_every_capability_with_what_it_asks_and_the_defaults(capsys) -> None:
    from conformance.cli import build_parser
    from conformance.targets.vendor import CONTRACT, DECLARABLE

    with pytest.raises(SystemExit):
        build_parser().parse_args(["certify", "--help"])
    text = capsys.readouterr().out
    assert ", ...)" not in text and "(default: 2,4)" in text and "(default: 30.0)" in text
    for cap in DECLARABLE:
        assert f"\n  {cap}\n    asks: " in text and CONTRACT[cap].split()[0] in text
    assert "needed by: SPLIT-BOUND-INHERIT" in text and "eager_connect_single_device" in text
