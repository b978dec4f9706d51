"""Run one body on n forked ranks over the simulator or gloo, and bring back plain results.

Each rank initialises the world (``init``: tcp store by default), runs ``body(rank, n)`` and returns
its value with tensors turned into (dtype, nested list) so results cross the process boundary
exactly and compare with ``==``. The wall time of the body is returned with it.
"""

from __future__ import annotations

import datetime
import faulthandler
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import simulator
from tests.forked import fork_and_collect

BACKENDS = {"sim": "cpu:sim", "gloo": "gloo"}

Body = Callable[[int, int], Any]
Init = Callable[[str, int, int, int, str], None]


def plain(x: Any) -> Any:
    """Tensors as ("tensor", dtype, values); containers recursively; everything else as is."""
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), x.detach().tolist())
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    return x


def tcp_init(backend: str, rank: int, n: int, port: int, tmpdir: str) -> None:
    """init_process_group over a TCPStore client of the parent's server."""
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group(BACKENDS[backend], store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))


def _child(backend: str, rank: int, n: int, ports: Any, tmpdir: str, init: Init, body: Body, q: Any) -> None:
    faulthandler.enable()
    try:
        torch.set_num_threads(1)  # 4+ ranks on 2 cores
        if backend == "sim":
            simulator.register()
        init(backend, rank, n, ports.get(timeout=30), tmpdir)
        start = time.perf_counter()
        out = body(rank, n)
        elapsed = time.perf_counter() - start
        dist.destroy_process_group()
        q.put((rank, "ok", (plain(out), elapsed)))
    except BaseException:  # reported to the parent, which asserts on it
        q.put((rank, "err", traceback.format_exc()[-3000:]))


def run_ranks(backend: str, n: int, body: Body, *, init: Init = tcp_init,
              deadline_s: float = 120.0) -> dict[int, tuple[str, Any]]:
    """{rank: ("ok", (value, seconds)) | ("err", traceback) | ("died", exitcode)}."""
    with tempfile.TemporaryDirectory(prefix="clients") as tmpdir:
        results, procs = fork_and_collect(
            n, _child, lambda r, ports, q: (backend, r, n, ports, tmpdir, init, body, q), deadline_s=deadline_s)
        for r, p in enumerate(procs):
            if r not in results:
                results[r] = ("died", p.exitcode)
    return results


def values(results: dict[int, tuple[str, Any]], n: int) -> list[Any]:
    """Every rank's value, asserting that every rank succeeded (naming the failures)."""
    bad = {r: v for r, v in results.items() if v[0] != "ok"}
    assert not bad, f"ranks failed: {bad}"
    return [results[r][1][0] for r in range(n)]


def wall(results: dict[int, tuple[str, Any]]) -> float:
    """The slowest rank's body time."""
    return max(v[1][1] for v in results.values())


def both(n: int, body: Body, **kw: Any) -> tuple[list[Any], list[Any]]:
    """Run ``body`` on sim and on gloo; return (sim values, gloo values)."""
    return values(run_ranks("sim", n, body, **kw), n), values(run_ranks("gloo", n, body, **kw), n)
