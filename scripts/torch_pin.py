"""The newest-torch pin (``ci/torch-newest.txt``): read it, and check that a venv installed exactly it.

    python scripts/torch_pin.py check [--pin FILE]   # exit 1 unless this interpreter's torch is the pinned release

pip can resolve a different torch quietly (a machine-wide constraint, a cached wheel, an unpinned dependency);
the check compares the installed release with the pin, ignoring the local build tag (``+cu132``).
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN_FILE = ROOT / "ci" / "torch-newest.txt"
_PIN_LINE = re.compile(r"^torch==(?P<version>\d+(?:\.\d+)+)$")


class PinError(ValueError):
    """The pin file does not hold exactly one ``torch==X.Y.Z`` line."""


def pinned_version(path: Path = PIN_FILE) -> str:
    """The release the pin file names, e.g. ``"2.15.0"``."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    pins = [line for line in lines if line and not line.startswith("#")]
    matches = [_PIN_LINE.match(line) for line in pins]
    if len(pins) != 1 or matches[0] is None:
        raise PinError(f"{path}: expected one line 'torch==X.Y.Z', found {pins!r}")
    return matches[0]["version"]


def release(version: str) -> str:
    """``"2.15.0+cu132"`` -> ``"2.15.0"``."""
    return version.split("+", 1)[0]


def mismatch(pinned: str, installed: str) -> str | None:
    """None when the installed torch is the pinned release, else a sentence naming both."""
    if release(installed) == pinned:
        return None
    return f"installed torch {installed} is not the pinned torch=={pinned}"


def main() -> int:
    """``check``: compare this interpreter's installed torch (its distribution's version, as pip installed it: no
    ``import torch``, which costs seconds of CPU) with the pin; exit 0 on a match, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["check"])
    parser.add_argument("--pin", type=Path, default=PIN_FILE)
    args = parser.parse_args()
    installed = metadata.version("torch")
    pinned = pinned_version(args.pin)
    problem = mismatch(pinned, installed)
    if problem:
        print(f"torch pin check: {problem} ({args.pin})", file=sys.stderr)
        return 1
    print(f"torch pin check: torch {installed} matches {args.pin.name} (torch=={pinned})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
