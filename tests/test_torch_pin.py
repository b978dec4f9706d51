"""The newest-torch stage of CI installs exactly the pinned release, even where pip is capped below it."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from torch_pin import PIN_FILE, PinError, mismatch, pinned_version  # noqa: E402

CHECK = [sys.executable, str(ROOT / "scripts" / "torch_pin.py"), "check"]


def test_pin_file_names_one_release() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned_version())


@pytest.mark.parametrize("text", ["", "torch>=2.15\n", "torch==2.15.0\ntorch==2.14.1\n", "numpy==2.0\n"])
def test_malformed_pin_file_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "pin.txt").write_text(text)
    with pytest.raises(PinError, match=re.escape("expected one line 'torch==X.Y.Z'")):
        pinned_version(tmp_path / "pin.txt")


def test_mismatch_ignores_the_build_tag_only() -> None:
    assert mismatch("2.15.0", "2.15.0+cu132") is None
    assert mismatch("2.15.0", "2.14.1+cu130") == "installed torch 2.14.1+cu130 is not the pinned torch==2.15.0"
    assert mismatch("2.15.0", "2.15.1") is not None


def test_check_passes_on_the_installed_release_and_fails_on_another(tmp_path: Path) -> None:
    here = tmp_path / "here.txt"
    installed = metadata.version("torch")
    here.write_text(f"torch=={installed.split('+')[0]}\n")
    ok = subprocess.run([*CHECK, "--pin", str(here)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    other = tmp_path / "other.txt"
    other.write_text("torch==0.0.1\n")
    bad = subprocess.run([*CHECK, "--pin", str(other)], capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert f"installed torch {installed} is not the pinned torch==0.0.1" in bad.stderr


def test_ci_installs_the_pin_without_the_machine_cap_and_checks_it() -> None:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    install = [i for i, line in enumerate(lines) if f"-r {PIN_FILE.relative_to(ROOT)}" in line]
    assert len(install) == 1, "stage 2 installs torch from the pin file, once"
    installs = [i for i, line in enumerate(lines) if line.startswith((".venvs/torch-newest/bin/pip", "PIP_CONFIG_FILE"))
                and ".venvs/torch-newest/bin/pip install" in line]
    assert install[0] in installs and len(installs) == 2, installs  # the pin (in the background), then this tree
    assert all(lines[i].startswith("PIP_CONFIG_FILE=/dev/null ") for i in installs), \
        "the cap in pip's configuration must not apply (it would resolve the installed torch against it)"
    check = lines.index(".venvs/torch-newest/bin/python scripts/torch_pin.py check")
    runs = [i for i, line in enumerate(lines) if ".venvs/torch-newest/bin/python -m" in line]
    assert max(installs) < check < min(runs), "the venv is checked after both installs, before stage 2 runs anything"
    assert not any(re.search(r"torch==\d", line) and "2.13" not in line for line in lines), \
        "the newest torch is named in the pin file only"
