"""Fork a world of rank processes over a loopback TCPStore port and collect what each rank reports."""

from __future__ import annotations

import multiprocessing as mp
import socket
from collections.abc import Callable
from typing import Any


def run_world(rank_main: Callable[..., None], world: int, *args: Any, timeout_s: float = 120.0) -> dict[int, Any]:
    """Run ``rank_main(rank, port, *args, out)`` in ``world`` forked processes; each puts ``(rank, value)`` on
    ``out``. Returns {rank: value}; a rank still alive 5 s after reporting is killed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=timeout_s) for _ in procs)
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    return results


def leave_together(store: Any, rank: int, world: int) -> None:
    """Wait until every rank is done; rank 0, which hosts the store, returns only after every other rank has
    said it is leaving (its last store call), so no rank's call is cut off by the host's exit ("Connection
    reset by peer")."""
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in range(world)])
    if rank:
        store.set(f"left/{rank}", "1")
    else:
        store.wait([f"left/{r}" for r in range(1, world)])
