"""certify tries the vendor import in a child process first: a hang, a segfault or a missing module is one
error line and exit 2, with no report and no per-requirement skips."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = {
    "cfm_hangs_on_import": "import time\ntime.sleep(600)\n",
    "cfm_segfaults_on_import": "import ctypes\nctypes.string_at(0)\n",
    "cfm_raises_on_import": "raise RuntimeError('vendor library not found: libcfm.so')\n",
    "cfm_registers_nothing": "print('loaded, registering nothing')\n",
    "cfm_exits_on_import": "import os\nos._exit(0)\n",
}


@pytest.mark.parametrize(("module", "says"), [
    ("cfm_hangs_on_import", "did not finish within 3 s"),
    ("cfm_segfaults_on_import", "killed the Python process (SIGSEGV)"),
    ("cfm_raises_on_import", "RuntimeError: vendor library not found: libcfm.so"),
    ("cfm_no_such_module", "ModuleNotFoundError: No module named 'cfm_no_such_module'"),
    ("cfm_registers_nothing", "cfm_registers_nothing.py) did not register backend 'cfmx' with "
                              "Backend.register_backend"),
    ("cfm_shadowed", "(an empty namespace package from "),
    ("cfm_exits_on_import", "ended the process (exit code 0)"),
])
def test_a_bad_vendor_import_is_one_line_and_exit_2(module, says, tmp_path: Path) -> None:
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)
    (tmp_path / "cfm_shadowed").mkdir()  # a directory named like a package, without __init__.py
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "conformance", "certify", "--backend", "cfmx", "--import", module, "--timeout", "3",
         "--world-sizes", "2", "--report-dir", str(tmp_path / "reports")],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and says in lines[0] and module in lines[0], proc.stderr[-2000:]
    assert "skip" not in proc.stderr and not (tmp_path / "reports").exists()
    assert time.monotonic() - started < 60
