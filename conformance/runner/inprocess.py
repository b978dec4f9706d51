"""The torchrun launcher: every process is one rank and runs the checks in-process.

Used on GPU hosts (one rank per GPU, multi-node through torchrun's rendezvous):

    torchrun --nproc-per-node 8 -m conformance run --target nccl --launcher env --world-sizes 8

Each rank joins the job through ``env://`` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and the
agent's store when torchrun provides one), runs every selected check with a fresh store prefix,
and sends its rank outcome to rank 0, which aggregates and writes the report. There is no pool to
rebuild here: a rank that crashes ends the job (torchrun reports it), and a hang is bounded by the
store timeout.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from conformance.report.model import RankOutcome, Result
from conformance.runner.execute import run_check
from conformance.runner.orchestrate import aggregate, case_result, precheck
from conformance.spec import Requirement


def join(timeout_s: float) -> tuple[dist.Store, int, int]:
    """(store, rank, world size) from torchrun's environment."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"--launcher env needs torchrun's environment; missing {missing}")
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    store.set_timeout(timedelta(seconds=timeout_s))
    return store, rank, world_size


def run_requirements(requirements: list[Requirement], target: str, target_options: dict[str, Any] | None,
                     timeout_s: float) -> list[Result] | None:
    """Run every requirement on this rank; rank 0 returns the aggregated results, others None."""
    store, rank, world_size = join(max(timeout_s, 300.0))
    results: list[Result] = []
    for i, req in enumerate(requirements):
        decided = precheck(req, target, target_options, world_size)
        if decided is not None:
            if rank == 0:
                results.append(case_result(req, target, world_size, *decided, 0.0))
            continue
        prefix = dist.PrefixStore(f"conformance/check{i}/", store)
        value = run_check(rank, world_size, dist.PrefixStore("run/", prefix), req.id, target, target_options,
                          timeout_s)
        prefix.set(f"outcome/{rank}", json.dumps(value))  # RankOutcome's wire form: data only, never pickle
        if rank == 0:
            keys = [f"outcome/{r}" for r in range(world_size)]
            prefix.wait(keys)
            ranks = [RankOutcome.from_json(json.loads(prefix.get(k))) for k in keys]
            results.append(case_result(req, target, world_size, *aggregate(ranks),
                                       max(r.duration_s or 0.0 for r in ranks), ranks))
    return results if rank == 0 else None
