"""Fork N rank processes that share a loopback TCPStore and collect what each reports (the suite's own
multi-process tests and benchmarks use it; the check runner and the framework front door use rank pools)."""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Callable
from typing import Any

import multiprocess
import torch.distributed as dist

CTX = multiprocess.get_context("fork")


def fork_and_collect(n: int, child: Callable[..., None], args_for: Callable[[int, Any, Any], tuple], *,
                     deadline_s: float, on_start: Callable[[list[Any]], None] | None = None
                     ) -> tuple[dict[int, tuple[str, Any]], list[Any]]:
    """Fork ``child(*args_for(rank, ports, results_queue))`` for each rank, then serve a TCPStore whose port
    each rank reads from ``ports``; a rank puts ``(rank, status, value)`` on the queue. Returns the results
    gathered by ``deadline_s`` and the processes (joined; killed by pid if still alive at the deadline)."""
    q, ports = CTX.Queue(), CTX.Queue()
    procs = [CTX.Process(target=child, args=args_for(r, ports, q), daemon=True) for r in range(n)]
    for p in procs:  # fork before the store's server thread exists: forking a threaded process can deadlock
        p.start()
    master = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    for _ in procs:
        ports.put(master.port)
    if on_start is not None:
        on_start(procs)
    results: dict[int, tuple[str, Any]] = {}
    end = time.monotonic() + deadline_s
    try:
        while len(results) < n and time.monotonic() < end:
            try:
                rank, status, value = q.get(timeout=0.2)
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and q.empty():
                    break
                continue
            results[rank] = (status, value)
    finally:
        for p in procs:
            p.join(timeout=max(0.1, end - time.monotonic()))
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=5)
    return results, procs


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
