"""README's set-up commands are the ones CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line for line in lines if line.startswith("python3 -m venv")]


def test_readme_has_exactly_two_setup_commands() -> None:
    assert len(_commands()) == 2


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _commands()[1] in ci


def test_main_job_runs_the_simulator_and_writes_a_report() -> None:
    main = _commands()[0]
    assert "conformance run --target sim" in main and "--report-dir reports" in main
