"""The fidelity job: torch's own distributed tests on gloo and on the simulator, side by side.

For each world size, one worker process (``conformance.fidelity.worker``) runs the selection on gloo; a
second runs on the simulator exactly the tests gloo did not skip. The comparison is written to
``<report dir>/fidelity-<torch>.json`` and ``.md``: gloo-pass / simulator-fail, gloo-only (with the reason
from the selection file), gloo's skips and failures, and any /dev/shm segment a test left behind.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from conformance.fidelity.selection import Selection
from conformance.fidelity.worker import ABSENT
from conformance.outcomes import Outcome

BACKENDS = ("gloo", "sim")


def run_worker(backend: str, world_size: int, tests: list[str], start_method: str,
               log: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Run ``tests`` on ``backend`` in a worker process (its progress lines on stdout, the ranks' own output
    to ``log``); ({test: record}, the worker's control record)."""
    if not tests:
        return {}, {}
    with tempfile.NamedTemporaryFile(prefix="fidelity", suffix=".jsonl", delete=False) as f:
        out = f.name
    env = dict(os.environ, FIDELITY_START_METHOD=start_method)
    try:
        subprocess.run([sys.executable, "-m", "conformance.fidelity.worker", "--backend", backend,
                        "--world-size", str(world_size), "--out", out, *tests],
                       env=env, stderr=log, check=False)
        lines = [json.loads(ln) for ln in Path(out).read_text().splitlines() if ln.strip()]
    finally:
        os.unlink(out)
    records = {r["test"]: r for r in lines if "test" in r}
    control = next((r["control"] for r in lines if "control" in r), {})
    for name in tests:  # a worker that died mid-way: the rest never ran
        records.setdefault(name, {"test": name, "outcome": Outcome.FAIL,
                                  "message": "the worker process died before it"})
    return records, control


def earlier_gloo(report: dict[str, Any], world_size: int, tests: list[str]) -> dict[str, dict[str, Any]]:
    """gloo's records for ``tests`` at ``world_size`` from an earlier report of this torch."""
    if report.get("torch") != torch.__version__:
        raise ValueError(f"the earlier report is of torch {report.get('torch')}, this is {torch.__version__}")
    size = next((s for s in report["world_sizes"] if s["world_size"] == world_size), None)
    rows = {r["test"]: r["gloo"] for r in size["rows"]} if size else {}
    missing = [t for t in tests if t not in rows]
    if missing:
        raise ValueError(f"the earlier report has no gloo record at world size {world_size} for {len(missing)} "
                         f"test(s): {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}")
    return {t: rows[t] for t in tests}


def verdict(selection: Selection, test: str, gloo: dict[str, Any], sim: dict[str, Any] | None) -> str:
    """How one test compares: match, sim-fail, gloo-only, gloo-skip, gloo-fail or absent."""
    if gloo["outcome"] in (ABSENT, Outcome.SKIP):
        return "absent" if gloo["outcome"] == ABSENT else "gloo-skip"
    if gloo["outcome"] != Outcome.PASS:
        return "gloo-fail"
    if selection.gloo_only_reason(test) is not None:
        return "gloo-only"
    return "match" if sim is not None and sim["outcome"] == Outcome.PASS else "sim-fail"


def run_job(selection: Selection, world_sizes: list[int], start_method: str = "fork",
            only: list[str] | None = None, log: Any = sys.stderr,
            gloo_from: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the selection (or the ``only`` tests of it) on gloo and the simulator; the report as data.
    ``gloo_from``, an earlier report of the same torch, supplies gloo's records instead of running gloo."""
    tests = [t for t in selection.tests if only is None or t in only]
    sizes = []
    for n in world_sizes:
        if gloo_from is not None:
            gloo = earlier_gloo(gloo_from, n, tests)
        else:
            gloo, _ = run_worker("gloo", n, tests, start_method, log)
        enabled = [t for t in tests if gloo[t]["outcome"] not in (Outcome.SKIP, ABSENT)]
        sim, sim_control = run_worker("sim", n, enabled, start_method, log)
        rows = []
        for t in tests:
            row = {"test": t, "area": selection.area_of(t), "gloo": gloo[t], "sim": sim.get(t),
                   "verdict": verdict(selection, t, gloo[t], sim.get(t))}
            rows.append(row)
        sizes.append({"world_size": n, "rows": rows,
                      "leak_probe_sees_segments": bool(sim_control.get("leak_probe_sees_segments"))})
    return {"torch": torch.__version__, "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "start_method": start_method, "selected": len(tests),
            "gloo_from": gloo_from["date"] if gloo_from is not None else None,
            "gloo_only": {k: {"tests": list(g.tests), "reason": g.reason, "source": list(g.source)}
                          for k, g in selection.gloo_only.items()},
            "world_sizes": sizes}


def leaks(report: dict[str, Any]) -> list[tuple[int, str, list[str]]]:
    """(world size, test, segments) for every test that left a segment in /dev/shm, on either backend."""
    found = []
    for size in report["world_sizes"]:
        for row in size["rows"]:
            for side in BACKENDS:
                rec = row[side]
                if rec and rec.get("leaked_segments"):
                    found.append((size["world_size"], f"{row['test']} ({side})", rec["leaked_segments"]))
    return found


def passed(report: dict[str, Any]) -> bool:
    """Every gloo pass outside the gloo-only list passes on the simulator, no segment was left, and the leak
    probe was seen to work."""
    return (all(r["verdict"] != "sim-fail" for s in report["world_sizes"] for r in s["rows"])
            and not leaks(report) and all(s["leak_probe_sees_segments"] for s in report["world_sizes"]))
