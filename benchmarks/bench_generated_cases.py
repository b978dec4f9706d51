"""Wall time of the suite with generated cases against the same commands before them, in one run window.

The baseline is a git ref (default ``main``) exported to a temporary directory and run from there with this
venv's interpreter (``python -m`` imports the package from the current directory). Rounds alternate
baseline and new so that the load of a shared machine falls on both alike. Commands:

- ``run --target sim --world-sizes 2,4`` (goal: 30 s on 2 cores with generation on);
- ``certify --backend toyccl --device cpu --import toyccl`` (goal: 60 s).

Each is also timed at ``--budget 0`` (boundary cases only). Prints a Markdown table of the medians.

Run: .venv/bin/python benchmarks/bench_generated_cases.py [--baseline REF] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "run --target sim --world-sizes 2,4": (["run", "--target", "sim", "--world-sizes", "2,4"], 30.0),
    "certify --backend toyccl --device cpu --import toyccl":
        (["certify", "--backend", "toyccl", "--device", "cpu", "--import", "toyccl"], 60.0),
}


def _timed(cwd: Path, argv: list[str], report_dir: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "conformance", *argv, "--report-dir", str(report_dir)], cwd=cwd,
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):  # 1: non-conformant is still a timed run; anything else is not
        raise SystemExit(f"{argv} in {cwd} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    """Time each command on the baseline, with --budget 0 and at the default budget; print medians."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default="main", help="git ref of the suite before generated cases")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        variants = {f"baseline ({args.baseline})": (base, []), "generated, --budget 0": (ROOT, ["--budget", "0"]),
                    "generated, default budget": (ROOT, [])}
        print(f"| command | {' | '.join(variants)} | goal |")
        print(f"| --- | {' | '.join('---' for _ in variants)} | --- |")
        for name, (argv, goal) in COMMANDS.items():
            times: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(args.rounds):
                for variant, (cwd, extra) in variants.items():
                    times[variant].append(_timed(cwd, [*argv, *(extra if cwd == ROOT else [])], Path(tmp) / "r"))
            cells = " | ".join(f"{statistics.median(t):.1f} s" for t in times.values())
            print(f"| `{name}` | {cells} | {goal:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
