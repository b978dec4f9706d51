"""POSIX shared-memory segments under /dev/shm (create, open, unlink, sweep), and nameless memfd handoffs for P2P."""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import re
import threading
import time

import torch

SHM_DIR = "/dev/shm"
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
# Names the simulator creates carry the creating pid: "<prefix><comm>.r<rank>.<pid>x<n>..." (prefix "cfm..." from
# the runner or "sim..." standalone), and fault markers "simfault-<parent pid>-<crc>".
_OWNED = re.compile(r"^(?:cfm|sim)\S*?\.r\d+\.(\d+)x\d+|^simfault-(\d+)-[0-9a-f]{8}$")
_RUNNER = re.compile(r"^cfm(\d+)p\d+_")
STALE_AFTER_S = 60.0  # a dead process's segment younger than this may still hold a message being received
_created: set[str] = set()  # segments this process created and has not unlinked
_created_owner = [os.getpid()]
_PRUNE_AT = 1024
_created_lock = threading.Lock()
_swept = [False]


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
    with _created_lock:
        if len(_created) >= _PRUNE_AT:  # segments a receiver unlinked: forget them
            _created.difference_update([n for n in _created if not os.path.exists(path(n))])
        _created.add(name)
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
    with _created_lock:
        _created.discard(name)
    try:
        os.unlink(path(name))
    except FileNotFoundError:
        return False
    return True


@atexit.register
def _unlink_created() -> None:
    """At exit, remove what this process created and nobody unlinked (e.g. after an uncaught RankTimeout)."""
    with _created_lock:
        names = list(_created) if _created_owner[0] == os.getpid() else []
    for name in names:
        unlink(name)


def _forget_in_child() -> None:
    _created.clear()
    _created_owner[0] = os.getpid()


os.register_at_fork(after_in_child=_forget_in_child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_dead(now: float | None = None) -> list[str]:
    """Remove the simulator's segments whose creating process is dead (and, for a runner's prefix, whose
    runner is dead too), once older than STALE_AFTER_S; return the names removed."""
    now = time.time() if now is None else now
    removed = []
    for name in os.listdir(SHM_DIR):
        owned = _OWNED.match(name)
        if owned is None:
            continue
        pid = int(owned.group(1) or owned.group(2))
        runner = _RUNNER.match(name)
        if _alive(pid) or (runner and _alive(int(runner.group(1)))):
            continue
        with contextlib.suppress(OSError):
            if now - os.stat(path(name)).st_mtime >= STALE_AFTER_S and unlink(name):
                removed.append(name)
    return removed


def sweep_dead_once() -> None:
    """``sweep_dead`` the first time a process calls it."""
    if not _swept[0]:
        _swept[0] = True
        sweep_dead()


def sweep(prefix: str) -> list[str]:
    """Delete every /dev/shm/<prefix>* file (leftovers of crashed ranks); return the names removed."""
    if not prefix:
        raise ValueError("shm.sweep needs a non-empty prefix; refusing to delete all of /dev/shm")
    removed = []
    for name in sorted(os.listdir(SHM_DIR)):
        if name.startswith(prefix) and unlink(name):
            removed.append(name)
    return removed


# ----------------------------------------------------------------------------- handoff segments
# A P2P message's bytes live in a memfd, which has no name in /dev/shm: the receiver opens it through
# /proc/<sender pid>/fd/<fd>, so nothing outlives the processes however they end (SIGTERM, SIGKILL, os._exit).
# The first HANDOFF_HEADER bytes hold a token (an fd number can be reused) and the receiver's "taken" flag.
HANDOFF_HEADER = 16


class Handoff:
    """One message segment on the sending side: the fd kept open until the receiver has taken the bytes."""

    def __init__(self, nbytes: int) -> None:
        self.fd = os.memfd_create("sim-p2p", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, HANDOFF_HEADER + nbytes)
            self._map = _map(self.fd, HANDOFF_HEADER + nbytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.token = int.from_bytes(os.urandom(7), "little")
        self._head = self._map[:HANDOFF_HEADER].view(torch.int64)
        self._head[0] = self.token
        self.ref = f"{os.getpid()}:{self.fd}:{self.token}"

    @property
    def data(self) -> torch.Tensor:
        """The message's bytes (uint8)."""
        return self._map[HANDOFF_HEADER:]

    def taken(self) -> bool:
        """True once the receiver has copied the bytes out (or refused them)."""
        return bool(self._head[1].item())

    def close(self) -> None:
        """Close the fd (the memory goes once no process maps it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_peer_fd(ref: str) -> tuple[int, int]:
    """(a descriptor of this process's own, the token) for another process's memfd named ``pid:fd:token``;
    FileNotFoundError if that process has closed it or ended."""
    pid, fd, token = (int(x) for x in ref.split(":"))
    try:
        return os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR), token
    except OSError:
        raise FileNotFoundError(ref) from None


def open_handoff(ref: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The receiver's (data, header) mappings of the handoff segment ``ref``; FileNotFoundError if the sender
    has closed it (its process ended, or it gave the message up)."""
    own, token = open_peer_fd(ref)
    try:
        whole = _map(own, os.fstat(own).st_size)
    finally:
        os.close(own)
    head = whole[:HANDOFF_HEADER].view(torch.int64)
    if head[0].item() != token:  # the fd number was reused for another file
        raise FileNotFoundError(ref)
    return whole[HANDOFF_HEADER:], head


def mark_taken(head: torch.Tensor) -> None:
    """Tell the sender its message has been taken (its fd can be closed)."""
    head[1] = 1
