"""A new target is one file plus one registration line (an entry point in ``conformance.targets``).

The file here is a complete target written against conformance.targets.base alone; its registration line
sits in an ``entry_points.txt``, as ``pip install`` writes it from a package's
``[project.entry-points."conformance.targets"]`` table (examples/toyccl/pyproject.toml has the same line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TARGET_FILE = textwrap.dedent('''
    """gloo under another name: a target written from scratch in one file."""

    import torch.distributed as dist

    from conformance.outcomes import Skipped
    from conformance.targets.base import Driver, Target


    class AgainTarget(Target):
        name = "glooagain"
        features = frozenset({"custom_backend", "p2p_tags", "p2p_any_source"})
        probes = ("launches", "store")
        default_backend = "cpu:gloo"

        def unavailable_reason(self, world_size=1):
            return None if dist.is_gloo_available() else "no gloo in this torch"

        def driver(self):
            return AgainDriver(self)


    class AgainDriver(Driver):
        def init_world(self, store, rank, world_size, spec, timeout_s):
            if spec.mode == "eager":
                raise Skipped("no device binding on cpu")
            return self._init_default_group(store, rank, world_size, spec, timeout_s)
''')
REGISTRATION = "glooagain = glooagain_target:AgainTarget"


def _package(root: Path, register: bool) -> dict[str, str]:
    """The target's file under ``root`` and, when ``register``, its one registration line; the env to see them."""
    (root / "glooagain_target.py").write_text(TARGET_FILE)
    if register:
        info = root / "glooagain-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: glooagain\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[conformance.targets]\n{REGISTRATION}\n")
    path = os.pathsep.join([str(root), *(p for p in sys.path if p)])
    return {**os.environ, "PYTHONPATH": path}


def _conformance(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("register", [True, False])
def test_one_file_and_one_line_make_a_listed_runnable_target(tmp_path: Path, register: bool) -> None:
    (tmp_path / "site").mkdir()
    env = _package(tmp_path / "site", register)
    listed = _conformance(env, "targets")
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = {line.split()[0]: line for line in listed.stdout.splitlines() if line.strip()}
    assert "toyccl" in names  # the example vendor's own entry point (examples/toyccl/pyproject.toml)
    if not register:  # the file alone is not a target: the line is what makes it one
        assert "glooagain" not in names
        return
    assert "available" in names["glooagain"] and "unavailable" not in names["glooagain"]
    run = _conformance(env, "run", "--target", "glooagain", "--requirement", "COLL-ROOTED,SPLIT-LINEAGE",
                       "--world-sizes", "2", "--report-dir", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = {r["requirement"]: r for r in json.loads((tmp_path / "out" / "glooagain.json").read_text())["results"]}
    assert results["COLL-ROOTED"]["outcome"] == "pass", results["COLL-ROOTED"]["detail"]
    # what the target lacks is named from its description (no split, no device binding)
    assert results["SPLIT-LINEAGE"]["outcome"] == "skip" and "split" in results["SPLIT-LINEAGE"]["detail"]
