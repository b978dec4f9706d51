"""Store connections reused across communicators: one per thread, returned when the thread ends.

A blocking store wait holds its connection, so every stream thread needs its own. Opening a
connection is usually sub-millisecond but, on some network stacks, every few connects stall for
seconds; threads come and go with communicators, so connections are kept in an idle list and
handed to the next thread instead of being opened anew.
"""

from __future__ import annotations

import threading

import torch.distributed as dist

_lock = threading.Lock()
_idle: dict[int, list[dist.Store]] = {}
_local = threading.local()


def acquire(root: dist.Store) -> dist.Store:
    """This thread's own connection to ``root``'s server (reused, or cloned once)."""
    held: dict[int, dist.Store] = _local.__dict__.setdefault("held", {})
    key = id(root)
    if key not in held:
        with _lock:
            pool = _idle.get(key)
            conn = pool.pop() if pool else None
        if conn is None:
            try:
                conn = root.clone()
            except (RuntimeError, AttributeError):  # stores without clone() are shared as they are
                conn = root
        held[key] = conn
    return held[key]


def release_thread() -> None:
    """Return this thread's connections to the idle list (call when a stream thread ends)."""
    held: dict[int, dist.Store] = _local.__dict__.pop("held", {})
    with _lock:
        for key, conn in held.items():
            _idle.setdefault(key, []).append(conn)
