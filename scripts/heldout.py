"""Certify toyccl with each held-out bug of a batch applied, and count how many the suite catches.

    python scripts/heldout.py [--batch scripts/heldout/batch1] [--suite-ref REF] [--world-sizes 2,4]

A batch is a folder of ``bugNN.patch`` (a diff of ``toyccl/``, one bug each, written by someone who had not
read the checks) and ``bugNN.md`` (its class, trigger and a script's output showing it). Each patch is
applied to a copy of ``examples/toyccl/toyccl`` (``--suite-ref``'s, default the working tree) that goes
first on ``PYTHONPATH``, and ``certify --backend toyccl`` judges it as CI would judge a vendor. A bug is
caught when the verdict is non-conformant; a patch that no longer applies is reported stale, not counted.
``--suite-ref`` judges with the suite of another commit (exported to a temporary directory), so a batch can
be measured against the suite before the changes it prompted. Prints one line per bug and the catch rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conformance.spec import load_catalog

ROOT = Path(__file__).resolve().parent.parent
CAPABILITIES = "examples/toyccl/capabilities.toml"


def _suite_tree(ref: str | None, scratch: Path) -> Path:
    """The tree whose suite judges: the working tree, or ``ref`` exported under ``scratch``."""
    if ref is None:
        return ROOT
    tree = scratch / "suite"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def _variant(tree: Path, patch: Path, scratch: Path) -> Path | None:
    """A folder holding ``toyccl/`` with ``patch`` applied, or None when the patch does not apply."""
    folder = scratch / patch.stem
    shutil.copytree(tree / "examples/toyccl/toyccl", folder / "toyccl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    applied = subprocess.run(["patch", "-p0", "-s", "--no-backup-if-mismatch", "-d", str(folder), "-i",
                              str(patch.resolve())], capture_output=True, text=True, check=False)
    return folder if applied.returncode == 0 else None


def _certify(tree: Path, variant: Path, world_sizes: str, report_dir: Path, frontend: set[str]) -> tuple[str, str]:
    """(verdict, the first failing backend MUST and its detail) of certify on ``variant``; requirements in
    ``frontend`` are torch's front end's, judged per torch version, not the backend's."""
    env = {**os.environ, "PYTHONPATH": str(variant)}
    subprocess.run([sys.executable, "-m", "conformance", "certify", "--backend", "toyccl", "--device", "cpu",
                    "--import", "toyccl", "--capabilities-file", CAPABILITIES, "--world-sizes", world_sizes,
                    "--report-dir", str(report_dir)], cwd=tree, env=env, capture_output=True, check=False)
    try:
        report = json.loads((report_dir / "toyccl.json").read_text())
    except (OSError, ValueError):
        return "no report", ""
    failed = next((r for r in report.get("results", []) if r.get("outcome") in ("fail", "error")
                   and r.get("level") == "MUST" and r.get("requirement") not in frontend), None)
    first = f"{failed['requirement']} ws{failed['world_size']}: {str(failed.get('detail', ''))[:140]}" if failed \
        else ""
    return str(report.get("verdict", "?")), first


def main() -> int:
    """Judge every bug of the batch; exit 0 when each applied, 1 when one was stale or gave no report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=Path, default=ROOT / "scripts/heldout/batch1")
    parser.add_argument("--suite-ref", help="judge with the suite of this git ref (default: the working tree)")
    parser.add_argument("--world-sizes", default="2,4")
    args = parser.parse_args()
    patches = sorted(args.batch.glob("bug*.patch"))
    if not patches:
        parser.error(f"no bug*.patch in {args.batch}")
    caught, judged, broken = 0, 0, False
    frontend = {r.id for r in load_catalog() if r.kind == "frontend"}
    with tempfile.TemporaryDirectory(prefix="heldout-") as tmp:
        scratch = Path(tmp)
        tree = _suite_tree(args.suite_ref, scratch)
        for patch in patches:
            variant = _variant(tree, patch, scratch)
            if variant is None:
                print(f"{patch.stem}: stale (the patch no longer applies to toyccl)", flush=True)
                broken = True
                continue
            verdict, first = _certify(tree, variant, args.world_sizes, scratch / f"{patch.stem}-report", frontend)
            judged += 1
            caught += verdict == "non-conformant"
            broken |= verdict == "no report"
            print(f"{patch.stem}: {verdict}{'  <- ' + first if first else ''}", flush=True)
    print(f"caught {caught} of {judged} ({100 * caught / max(judged, 1):.0f}%), suite "
          f"{args.suite_ref or 'working tree'}, batch {args.batch}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
