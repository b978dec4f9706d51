"""Wall times of real client programs on the simulator and on gloo, from one run on this machine.

- DDP: the 3-step float64 MLP of tests/clients/test_ddp.py (default buckets) at 2 and 4 ranks,
  DDP construction included.
- Megatron-like: 20 groups at world 8 (tensor, data, pipeline, model-parallel, tp x dp and
  embedding groups, new_group on every rank), then one all_reduce on each group a rank is in.

The time is the slowest rank's, from after init_process_group to the end of the program (forked
ranks, one intra-op thread each, TCPStore on loopback).

Run: .venv/bin/python benchmarks/bench_clients.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.clients.harness import run_ranks, values, wall
from tests.clients.megatron_like import build_and_reduce, group_count
from tests.clients.test_ddp import train

CASES = [
    ("DDP, 3 steps", 2, train("default")),
    ("DDP, 3 steps", 4, train("default")),
    (f"Megatron-like, {group_count(8)} groups", 8, build_and_reduce),
]


def main() -> None:
    """Print one Markdown table row per case: sim and gloo seconds."""
    print("| program | ranks | sim (s) | gloo (s) |\n| --- | --- | --- | --- |")
    for name, n, body in CASES:
        times = []
        for backend in ("sim", "gloo"):
            results = run_ranks(backend, n, body, deadline_s=300)
            values(results, n)  # every rank succeeded
            times.append(wall(results))
        print(f"| {name} | {n} | {times[0]:.2f} | {times[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
