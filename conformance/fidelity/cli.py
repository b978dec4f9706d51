"""``python -m conformance fidelity``: run the fidelity job and write reports/fidelity-<torch>.{json,md}."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from conformance.fidelity.job import earlier_gloo, leaks, passed, run_job
from conformance.fidelity.markdown import render
from conformance.fidelity.selection import SELECTION, load
from conformance.report.write import atomic_write_text


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `fidelity` subcommand's arguments."""
    p.add_argument("--world-sizes", default="2,4", help="comma-separated world sizes (default 2,4)")
    p.add_argument("--selection", type=Path, default=SELECTION, help="the selection file (TOML)")
    p.add_argument("--tests", default=None, help="comma-separated subset of the selection to run")
    p.add_argument("--start-method", choices=("fork", "spawn"), default="fork",
                   help="how each test's ranks start: fork (default; no torch import per rank) or spawn "
                        "(upstream's way, ~10x slower per test on a loaded 2-core host)")
    p.add_argument("--report-dir", type=Path, default=Path("reports"))
    p.add_argument("--name", default=None, help="report file stem (default fidelity-<torch version>)")
    p.add_argument("--gloo-from", type=Path, default=None, metavar="FIDELITY.json",
                   help="take gloo's outcomes from an earlier report of this torch instead of running gloo again")
    p.add_argument("--log", type=Path, default=None,
                   help="where the ranks' own output goes (default: a fidelity-*.log file in the temp dir)")


def cmd_fidelity(args: argparse.Namespace) -> int:
    """Entry point of ``python -m conformance fidelity``: 0 when the simulator passes every test gloo passes
    (gloo-only ones aside) and leaves no segment behind, 1 otherwise, 2 for bad input."""
    try:
        selection = load(args.selection)
        sizes = [int(n) for n in args.world_sizes.split(",")]
        only = args.tests.split(",") if args.tests else None
        unknown = sorted(set(only or ()) - set(selection.tests))
        if unknown or any(n < 2 for n in sizes):
            raise ValueError(f"tests not in the selection: {unknown}" if unknown else "world sizes must be >= 2")
        gloo_from = json.loads(args.gloo_from.read_text()) if args.gloo_from else None
        for n in sizes if gloo_from is not None else ():
            earlier_gloo(gloo_from, n, only or selection.tests)  # refused now rather than after hours of running
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log_path = args.log or Path(tempfile.mkstemp(prefix="fidelity-", suffix=".log")[1])
    print(f"the ranks' own output goes to {log_path}")
    with open(log_path, "w") as log:
        report = run_job(selection, sizes, args.start_method, only, log, gloo_from)
    version = torch.__version__.split("+")[0]
    args.report_dir.mkdir(parents=True, exist_ok=True)
    command = "python -m conformance fidelity " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["fidelity"] else [])
    stem = args.name or f"fidelity-{version}"
    atomic_write_text(args.report_dir / f"{stem}.json", json.dumps(report, indent=1) + "\n")
    atomic_write_text(args.report_dir / f"{stem}.md", render(report, command.strip()))
    for size in report["world_sizes"]:
        for row in size["rows"]:
            if row["verdict"] == "sim-fail":
                print(f"ws {size['world_size']} {row['test']}: gloo passes, the simulator fails: "
                      f"{row['sim']['message'] if row['sim'] else 'not run'}")
    for n, test, segs in leaks(report):
        print(f"ws {n} {test}: left {segs} in /dev/shm")
    print(f"wrote {args.report_dir}/{stem}.md: {'as gloo' if passed(report) else 'NOT as gloo'}")
    return 0 if passed(report) else 1
