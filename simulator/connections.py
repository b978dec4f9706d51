"""Store connections reused across communicators: one per thread, returned when the thread ends.

A blocking store wait holds its connection, so every stream thread needs its own. Opening a
connection is usually sub-millisecond but, on some hosts, connects made at once stall for 5 or 10 s
(measured on this sandbox: 30 clones from threads of one process, 17 took 5.0 s; 32 processes
opening 15 each one after another, 100 s), so connections are opened concurrently (stalls overlap)
and, as threads come and go with communicators (lazy P2P: one stream per peer), kept in an idle list
and handed to the next thread instead of being opened anew: a rank opens at most as many as it
ever had threads waiting at once.

Connections are keyed by the root store object itself (weakly): when a world's store goes away,
its connections, idle or held by a long-lived thread, are dropped and their sockets closed, and a
new store that happens to reuse the old one's address never gets a connection to a dead server.
At most MAX_IDLE connections per store are kept idle (enough for a stream per peer of a world of
256 ranks); the rest are closed.
"""

from __future__ import annotations

import threading
import weakref

import torch.distributed as dist

MAX_IDLE = 256
_lock = threading.Lock()
_idle: weakref.WeakKeyDictionary[dist.Store, list[dist.Store]] = weakref.WeakKeyDictionary()
_local = threading.local()


def _held() -> weakref.WeakKeyDictionary[dist.Store, dist.Store]:
    held = getattr(_local, "held", None)
    if held is None:
        held = _local.held = weakref.WeakKeyDictionary()
    return held


def acquire(root: dist.Store) -> dist.Store:
    """This thread's own connection to ``root``'s server (reused, or cloned once)."""
    held = _held()
    conn = held.get(root)
    if conn is None:
        with _lock:
            pool = _idle.get(root)
            conn = pool.pop() if pool else None
        if conn is None:
            try:
                conn = root.clone()
            except (RuntimeError, AttributeError):  # stores without clone() are shared as they are
                conn = root
        held[root] = conn
    return conn


def release_thread() -> None:
    """Return this thread's connections to the idle list (call when a stream thread ends)."""
    held = _held()
    _local.held = None
    with _lock:
        for root, conn in list(held.items()):
            if conn is root:
                continue
            idle = _idle.setdefault(root, [])
            if len(idle) < MAX_IDLE:
                idle.append(conn)


def idle_count() -> int:
    """How many idle connections are kept, over every live store."""
    with _lock:
        return sum(len(v) for v in _idle.values())
