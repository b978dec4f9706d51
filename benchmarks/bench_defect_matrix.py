"""Wall time of the defect matrix, the way it ran before against the way it runs now, in one run.

Before: every planted defect against every requirement, one case after another in one set of rank
pools, each case run to its end (``lanes=1, everything=True, stop_early=False``: the cases and the pools
the old loop over ``run_suite`` used). Now: each simulator switch only against the checks whose clean run
consulted it, every case in ``LANES`` parallel lanes, a case ended once a rank fails. Prints both wall
times, their ratio, whether the two matrices agree on what caught each defect, and the defects that took
longest now. Then first-catch mode (CI's guard: only the cases that can still change a verdict, each defect
first against its catches in reports/defects.json): its wall time, its ratio to now, and whether its three
verdicts are now's.

Run: .venv/bin/python benchmarks/bench_defect_matrix.py [--skip-before] [--lanes 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conformance.defect_matrix import LANES, earlier_catches, run_matrix

SIZES = [2, 4]
TIMEOUT_S = 8.0  # the CLI's default for `defects`
EARLIER = Path(__file__).resolve().parents[1] / "reports" / "defects.json"
VERDICTS = ("kill_rate", "teeth_rate", "uncaught_mutants", "requirements_without_teeth", "clean_must_failures")


def _timed(lanes: int, everything: bool, stop_early: bool,
           first_catch: bool = False) -> tuple[float, int, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        code = run_matrix(SIZES, Path(folder), TIMEOUT_S, lanes=lanes, everything=everything, stop_early=stop_early,
                          first_catch=first_catch, earlier=earlier_catches(EARLIER) if first_catch else None)
        wall = time.perf_counter() - started
        return wall, code, json.loads((Path(folder) / "defects.json").read_text())


def _caught(matrix: dict[str, Any]) -> dict[str, list[str]]:
    return {m: sorted(row["caught_by"]) for m, row in matrix["mutants"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-before", action="store_true", help="time only the current method")
    parser.add_argument("--lanes", type=int, default=LANES)
    args = parser.parse_args()
    now_s, now_code, now = _timed(args.lanes, everything=False, stop_early=True)
    print(f"now:    {now_s:6.1f} s  ({args.lanes} lanes, consulted pairs only; exit {now_code})")
    if not args.skip_before:
        before_s, before_code, before = _timed(1, everything=True, stop_early=False)
        print(f"before: {before_s:6.1f} s  (1 lane, every pair; exit {before_code})  ratio {before_s / now_s:.1f}x")
        differ = {m: (c, _caught(now).get(m)) for m, c in _caught(before).items() if c != _caught(now).get(m)}
        print(f"caught-by lists that differ: {differ or 'none'}")
    first_s, first_code, first = _timed(args.lanes, everything=False, stop_early=True, first_catch=True)
    skipped = sum(map(len, first["skipped"].values()))
    same = {k: (now[k], first[k]) for k in VERDICTS if now[k] != first[k]}
    print(f"first catch: {first_s:6.1f} s  ({skipped} planted cases skipped; exit {first_code})  "
          f"now / first catch {now_s / first_s:.1f}x; verdicts that differ: {same or 'none'}")
    slowest = sorted(now["seconds"].items(), key=lambda kv: -kv[1])[:10]
    print("slowest defects now (seconds of their cases, summed over lanes):")
    for name, seconds in slowest:
        print(f"  {name:<34} {seconds:6.1f}")


if __name__ == "__main__":
    main()
