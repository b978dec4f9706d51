"""POSIX shared-memory segments under /dev/shm: create, open, unlink and sweep."""

from __future__ import annotations

import mmap
import os

import torch

SHM_DIR = "/dev/shm"
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def path(name: str) -> str:
    """Return the filesystem path of segment `name`."""
    return os.path.join(SHM_DIR, name)


def _map(fd: int, nbytes: int) -> torch.Tensor:
    mm = mmap.mmap(fd, nbytes, flags=_MAP_FLAGS, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    # The tensor keeps the mmap object alive; the mapping goes away with the last tensor view.
    return torch.frombuffer(mm, dtype=torch.uint8)


def create(name: str, nbytes: int) -> torch.Tensor:
    """Create segment `name` of `nbytes` (> 0) bytes and return a uint8 tensor mapping it."""
    fd = os.open(path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        return _map(fd, nbytes)
    except BaseException:
        unlink(name)
        raise
    finally:
        os.close(fd)


def open_segment(name: str) -> torch.Tensor:
    """Map the existing segment `name` read-write and return it as a uint8 tensor."""
    fd = os.open(path(name), os.O_RDWR)
    try:
        return _map(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def exists(name: str) -> bool:
    """Return whether segment `name` is still present in /dev/shm."""
    return os.path.exists(path(name))


def unlink(name: str) -> bool:
    """Remove segment `name`; return False if it was already gone. Existing mappings stay valid."""
    try:
        os.unlink(path(name))
    except FileNotFoundError:
        return False
    return True


def sweep(prefix: str) -> list[str]:
    """Delete every /dev/shm/<prefix>* file (leftovers of crashed ranks); return the names removed."""
    if not prefix:
        raise ValueError("shm.sweep needs a non-empty prefix; refusing to delete all of /dev/shm")
    removed = []
    for name in sorted(os.listdir(SHM_DIR)):
        if name.startswith(prefix) and unlink(name):
            removed.append(name)
    return removed
