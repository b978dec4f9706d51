"""How the simulator's lazy P2P scales with the world: time per world size and per pair communicator.

Per world size (default 8, 16, 32, 64), one run of n forked ranks on the simulator (lazy init, no device
bound, so P2P makes one 2-rank communicator per unordered pair, as ProcessGroupNCCL does): every rank
sends 8 floats to every other rank (isend/irecv, all at once), then again (the pair communicators are
reused). Printed: wall time of the first all-pairs round (it creates the pair communicators), of the
second (reuse only), the pair communicators created (counted from the simulator's event log, both
members of a pair record it) and the first round's time per pair communicator. The baseline in the same
run is the second round: creation cost = first - second.

With --area, also the wall time of `python -m conformance run --target sim --area split,p2p
--world-sizes n` per size, and that time per pair of ranks (n(n-1)/2).

Run: .venv/bin/python benchmarks/bench_scale.py [--worlds 8,16,32,64] [--area]
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import simulator
from simulator import shm
from simulator.comm import SHM_PREFIX_ENV
from tests.forked import fork_and_collect

PREFIX = f"benchscale{os.getpid()}_"


def _round(rank: int, n: int, salt: float) -> None:
    works, bufs = [], []
    for peer in range(n):
        if peer != rank:
            works.append(dist.isend(torch.full((8,), rank + salt), peer))
            buf = torch.zeros(8)
            works.append(dist.irecv(buf, peer))
            bufs.append((peer, buf))
    for w in works:
        w.wait()
    bad = [p for p, b in bufs if b[0].item() != p + salt]
    if bad:
        raise RuntimeError(f"rank {rank}: all-pairs round {salt}: wrong data from ranks {bad[:5]}")


def _line_up(store: dist.Store, n: int, name: str) -> None:
    """A barrier through the store (a collective would make the group communicator, which P2P then uses)."""
    store.add(name, 1)
    while int(store.add(name, 0)) < n:
        time.sleep(1e-3)


def _rank(ports: Any, n: int, rank: int, q: Any) -> None:
    try:
        os.environ[SHM_PREFIX_ENV] = PREFIX
        # lazy P2P is what is measured: its warning, once per rank, would bury the table
        warnings.filterwarnings("ignore", message="simulator: send/recv on a lazily initialised group")
        torch.set_num_threads(1)
        simulator.register()
        store = dist.TCPStore("127.0.0.1", ports.get(timeout=60), is_master=False,
                              timeout=datetime.timedelta(seconds=300))
        dist.init_process_group("cpu:sim", store=store, rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=300))
        _line_up(store, n, "start")
        times = []
        for salt in (1.0, 2.0):
            started = time.perf_counter()
            _round(rank, n, salt)
            _line_up(store, n, f"round{salt}")
            times.append(time.perf_counter() - started)
        pair_comms = sum(1 for e in simulator.LOG.events("comm_created") if e.get("mode") == "p2p")
        dist.destroy_process_group()
        q.put((rank, "ok", (times, pair_comms)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        q.put((rank, "err", f"{type(exc).__name__}: {exc}"))


def measure(n: int) -> tuple[float, float, int]:
    """(first round s, second round s, pair communicators created) for one world of n ranks."""
    try:
        results, _ = fork_and_collect(n, _rank, lambda r, ports, q: (ports, n, r, q), deadline_s=600)
    finally:
        shm.sweep(PREFIX)
    errs = {r: v for r, (s, v) in results.items() if s != "ok"}
    if errs or len(results) != n:
        raise RuntimeError(f"world {n}: ranks failed or missing: {errs or sorted(set(range(n)) - set(results))}")
    first = max(v[0][0] for _, v in results.values())
    second = max(v[0][1] for _, v in results.values())
    return first, second, sum(v[1] for _, v in results.values()) // 2


def area_seconds(n: int, cwd: str | None = None) -> tuple[float, int]:
    """Wall seconds of the split,p2p areas at world n on the sim target, and the command's exit code (run in
    ``cwd``, default this process's: ``-m conformance`` imports the suite found there first)."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--target", "sim", "--area", "split,p2p",
                           "--world-sizes", str(n), "--report-dir", f"/tmp/bench_scale_{os.getpid()}_{n}"],
                          capture_output=True, text=True, check=False, cwd=cwd)
    return time.perf_counter() - started, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="8,16,32,64")
    parser.add_argument("--area", action="store_true", help="also time the split,p2p conformance areas")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPU cores, torch {torch.__version__}; lazy P2P, all pairs, 8 floats per message")
    print(f"{'world':>5} {'pair comms':>10} {'1st round s':>11} {'2nd round s':>11} {'per pair comm ms':>16} "
          f"{'creation per pair ms':>20}" + (f" {'area s':>7} {'rc':>3} {'area per pair ms':>16}" if args.area else ""))
    for n in (int(x) for x in args.worlds.split(",")):
        first, second, pairs = measure(n)
        line = (f"{n:>5} {pairs:>10} {first:>11.2f} {second:>11.2f} {first / max(pairs, 1) * 1e3:>16.2f} "
                f"{(first - second) / max(pairs, 1) * 1e3:>20.2f}")
        if args.area:
            secs, rc = area_seconds(n)
            line += f" {secs:>7.1f} {rc:>3} {secs / (n * (n - 1) // 2) * 1e3:>16.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
