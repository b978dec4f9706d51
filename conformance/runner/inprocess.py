"""The torchrun launcher (``run --launcher env``): every torchrun process is one rank of the job and a CUDA-free
supervisor of that rank's checks.

Each check runs in a one-rank ``RankPool`` child that joins the job's store as job rank RANK, so a crash, hang
or raise costs that check only; rank 0 gathers the ranks' outcomes through the store and reports
(ARCHITECTURE.md, "One case", step 4). It cannot see a peer's crash other than through that peer's outcome:
a rank whose peer crashed fails or waits out the check's timeout on its own. Every rank starts each check
together, through the store, so that wait is not charged to the next check.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from conformance.report.model import RankOutcome, Result
from conformance.runner.execute import run_check
from conformance.runner.orchestrate import POOL_GRACE_S, aggregate, case_result, precheck, rank_outcome
from conformance.runner.pool import GPU_START_METHOD, PoolSet
from conformance.spec import Requirement
from conformance.targets import make_target

TASK = "conformance.runner.inprocess:run_rank"
_clients: dict[tuple[str, int], dist.TCPStore] = {}


def join(timeout_s: float) -> tuple[dist.Store, int, int]:
    """(store, rank, world size) from torchrun's environment."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"--launcher env needs torchrun's environment; missing {missing}")
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    store.set_timeout(timedelta(seconds=timeout_s))
    return store, rank, world_size


def run_rank(rank: int, world_size: int, store: dist.Store, *, job_rank: int, job_world_size: int, host: str,
             port: int, prefix: str, **check: Any) -> dict[str, Any]:
    """The pool task: run one check as rank ``job_rank`` of the torchrun job, over the job's store.

    ``rank``, ``world_size`` and ``store`` are the one-rank pool's own and are not used; the connection to
    the job's store is made once per child process.
    """
    client = _clients.get((host, port))
    if client is None:
        client = _clients[(host, port)] = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                                        timeout=timedelta(seconds=max(check["timeout_s"], 300.0)))
    return run_check(job_rank, job_world_size, dist.PrefixStore(prefix, client), **check)


def run_requirements(requirements: list[Requirement], target_name: str, target_options: dict[str, Any] | None,
                     timeout_s: float) -> list[Result] | None:
    """Run every requirement, each in this rank's child; rank 0 returns the aggregated results, others None."""
    store, rank, world_size = join(max(timeout_s, 300.0))
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    target = make_target(target_name, target_options)
    start_method = GPU_START_METHOD if target.gpu else None
    pools = PoolSet()
    results: list[Result] = []
    try:
        for i, req in enumerate(requirements):
            decided = precheck(req, target_name, target_options, world_size)
            if decided is not None:
                if rank == 0:
                    results.append(case_result(req, target_name, world_size, *decided, 0.0))
                continue
            # every rank starts the check together: a rank that waited out its previous check's timeout
            # (its peer crashed) must not spend its peers' timeout on this one
            shared = dist.PrefixStore(f"conformance/attempt{attempt}/check{i}/", store)
            shared.set(f"started/{rank}", "1")
            shared.wait([f"started/{r}" for r in range(world_size)])
            # as runner/orchestrate.run_case: checks a target names get a child of their own
            isolated = target.isolates(req)
            pool = pools.fresh(1, start_method) if isolated else pools.get(1, start_method)
            pool.on_kill(target_name, target.cleanup)
            try:
                (report,) = pool.run(TASK, {
                    "job_rank": rank, "job_world_size": world_size, "host": host, "port": port,
                    "prefix": f"conformance/attempt{attempt}/check{i}/run/", "requirement_id": req.id,
                    "target_name": target_name, "target_options": target_options, "timeout_s": timeout_s,
                }, timeout_s + POOL_GRACE_S)
            finally:
                if isolated:
                    pool.close()
            # the pool's one rank (0) is this job rank, also in the heading of a crash's stacks (pool._fatal_stack)
            stacks = report.traceback.replace("stacks of rank 0 (pid", f"stacks of rank {rank} (pid", 1)
            mine = rank_outcome(replace(report, rank=rank, traceback=stacks))
            shared.set(f"outcome/{rank}", json.dumps(mine.to_json()))  # RankOutcome's wire form: data, never pickle
            if rank == 0:
                keys = [f"outcome/{r}" for r in range(world_size)]
                shared.wait(keys)
                ranks = [RankOutcome.from_json(json.loads(shared.get(k))) for k in keys]
                results.append(case_result(req, target_name, world_size, *aggregate(ranks),
                                           max(r.duration_s or 0.0 for r in ranks), ranks))
    finally:
        pools.close()
    return results if rank == 0 else None
