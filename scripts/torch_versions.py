"""Run the suite on several torch versions, each in its own venv, and tabulate the verdicts.

    python scripts/torch_versions.py [VERSION[=VENV] ...] [--targets sim,gloo] [--venv-root DIR]

Defaults: torch 2.11.0 2.13.0 2.14.1 and the newest (``ci/torch-newest.txt``, as CI's second stage),
targets sim and gloo, venvs under ``.venvs/`` (git-ignored). Each venv gets ``pip install torch==VERSION -e .``
(the registry's CUDA builds run on a CPU-only host; 2.15.0 is about 2.6 GB); a release newer than the
machine's pip cap (``/etc/xdg/pip``: torch<=2.14.1) is installed with the pip configuration dropped
(``PIP_CONFIG_FILE=/dev/null``), as ``.ci/run`` does, and every venv is checked to hold the release asked
for. Each run writes ``reports/torch-<version>/<target>.{json,md}``; the verdict table goes to
``reports/torch-versions.md`` and stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from torch_pin import mismatch, pinned_version

ROOT = Path(__file__).resolve().parent.parent
NEWEST = pinned_version()
DEFAULT_VERSIONS = ("2.11.0", "2.13.0", "2.14.1", NEWEST)


def ensure_venv(version: str, venv: Path) -> Path:
    """The venv's python, creating the venv and installing torch==version and the suite if needed.

    The newest release is installed with the machine's pip configuration dropped (its cap would refuse it);
    the others keep it (it points pip at the wheels on this disk). Raises SystemExit naming both releases
    if the venv ends up holding another torch."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pin = "torch==2.13.*" if version.startswith("2.13") else f"torch=={version}"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull} if version == NEWEST else None
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", pin, "-e", str(ROOT)], check=True, env=env)
    installed = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], check=True,
                               capture_output=True, text=True).stdout.strip()
    problem = mismatch(version, installed) if not version.startswith("2.13") else None
    if problem:
        raise SystemExit(f"{venv}: {problem}")
    return python


def run_target(python: Path, target: str, out: Path, world_sizes: str) -> dict:
    """One ``conformance run``; returns the report's verdict, counts and wall time."""
    start = time.monotonic()
    proc = subprocess.run([str(python), "-m", "conformance", "run", "--target", target, "--world-sizes",
                           world_sizes, "--report-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - start
    path = out / f"{target}.json"
    if not path.exists():
        return {"verdict": f"no report (exit {proc.returncode})", "wall_s": wall, "tail": proc.stdout[-2000:]}
    report = json.loads(path.read_text())
    counts = report["summary"]["by_outcome"]
    return {"verdict": report["verdict"], "torch": report["environment"]["torch"], "wall_s": wall, **counts}


def table(rows: list[dict]) -> str:
    """The Markdown verdict table, one row per (torch, target)."""
    lines = ["| torch | target | verdict | pass | fail | error | waived | skip | not-observable |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r.get('torch', r['version'])} | {r['target']} | {r['verdict']} | {r.get('pass', '')} | "
                     f"{r.get('fail', '')} | {r.get('error', '')} | {r.get('waived', '')} | {r.get('skip', '')} | "
                     f"{r.get('not-observable', '')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    """Run every version and target; exit 0 when every verdict is conformant."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("versions", nargs="*", default=list(DEFAULT_VERSIONS), help="VERSION or VERSION=VENV")
    p.add_argument("--targets", default="sim,gloo")
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--venv-root", type=Path, default=ROOT / ".venvs")
    args = p.parse_args()
    rows: list[dict] = []
    for item in args.versions:
        version, _, venv = item.partition("=")
        python = ensure_venv(version, Path(venv) if venv else args.venv_root / f"torch-{version}")
        for target in args.targets.split(","):
            row = {"version": version, "target": target,
                   **run_target(python, target, ROOT / "reports" / f"torch-{version}", args.world_sizes)}
            print(f"torch {version} {target}: {row['verdict']} ({row['wall_s']:.0f} s)", flush=True)
            rows.append(row)
    text = table(rows)
    (ROOT / "reports" / "torch-versions.md").write_text(
        "# Verdicts per torch version\n\nWritten by `scripts/torch_versions.py`.\n\n" + text)
    print(text)
    return 0 if all(r["verdict"].startswith("conformant") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
