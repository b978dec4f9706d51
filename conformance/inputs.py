"""Validation of user input (CLI flags, pytest options): refused before anything runs, one line each."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

# The pool launcher forks one process per rank on this host; beyond this it would fork without bound.
MAX_WORLD_SIZE = 64


class InputError(ValueError):
    """A value given by the user that the suite refuses; the message names the value."""


def world_sizes(text: str) -> list[int]:
    """Parse ``"2,4"`` into sorted unique sizes, each in [1, MAX_WORLD_SIZE].

    World size 1 is accepted (a single-GPU host runs NCCL at 1 rank): a requirement runs there only if
    its spec lists 1 among its world sizes; the others skip as needing 2 ranks."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"world sizes must be comma-separated integers, got {text!r}") from None
    if not sizes:
        raise InputError(f"world sizes: none given in {text!r}")
    for n in sizes:
        if n < 1:
            raise InputError(f"world sizes must be positive, got {n} in {text!r}")
        if n > MAX_WORLD_SIZE:
            raise InputError(f"world size {n} is above the bound of {MAX_WORLD_SIZE} rank processes per host")
    return sorted(set(sizes))


def timeout(text: str | float) -> float:
    """A per-check timeout in seconds: a finite number above zero."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InputError(f"timeout must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"timeout must be a finite number of seconds above 0, got {text!r}")
    return value


def report_dir(path: Path) -> Path:
    """Create ``path`` if needed and prove a file can be written there; else InputError naming it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"report dir {str(path)!r} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"report dir {str(path)!r} is not writable: {exc.strerror or exc}") from None
    return path


MAX_BUDGET = 10_000


def seed(text: str) -> int:
    """A case-generation seed: an integer from 0 to 2**32 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"seed must be an integer, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise InputError(f"seed must be in [0, 2**32), got {text!r}")
    return value


def budget(text: str) -> int:
    """Random generated cases per plan on top of the boundary ones: an integer from 0 to MAX_BUDGET."""
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"budget must be an integer number of cases, got {text!r}") from None
    if not 0 <= value <= MAX_BUDGET:
        raise InputError(f"budget must be in [0, {MAX_BUDGET}] sampled cases per plan, got {text!r}")
    return value
