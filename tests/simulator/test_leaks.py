"""Re-initialising simulator worlds does not leak file descriptors; stale shm of dead processes is swept;
nothing read back from a store is unpickled."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from conformance.runner import RankPool
from simulator import shm
from tests.runner import tasks

T = tasks.__name__


@pytest.mark.parametrize("fresh_store", [True, False])
def test_fds_stay_flat_over_50_reinits(fresh_store: bool) -> None:
    pool = RankPool(2)
    try:
        reports = pool.run(f"{T}:fds_over_reinits", {"rounds": 50, "fresh_store": fresh_store}, timeout_s=300)
        assert all(r.status == "ok" for r in reports), [(r.error, r.traceback) for r in reports]
        for r in reports:
            early, late = r.value[5], r.value[50]
            added = Counter(late) - Counter(early)
            growth = f"rank {r.rank}: {len(early)} fds after 5 re-inits, {len(late)} after 50"
            print(growth)
            assert len(late) - len(early) <= 4, f"{growth}; opened since: {sorted(added.elements())}"
    finally:
        pool.close()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_segments_of_an_uncaught_error_are_removed_at_exit() -> None:
    code = ("import os\nfrom simulator import shm\n"
            "name = f'simtest{os.getpid()}_c0.r0.{os.getpid()}x1.p1.0'\nprint(name, flush=True)\n"
            "shm.create(name, 64)\nraise RuntimeError('an uncaught RankTimeout, say')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    name = proc.stdout.strip()
    assert proc.returncode == 1 and name, proc.stderr[-1000:]
    assert not os.path.exists(f"/dev/shm/{name}"), "the segment outlived its process"


def test_sweep_removes_stale_segments_of_dead_processes_only() -> None:
    dead, live = _dead_pid(), os.getpid()
    old = time.time() - 2 * shm.STALE_AFTER_S
    names = {
        f"simtest{dead}_c0.r0.{dead}x1": True,             # dead creator, old: swept
        f"simfault-{dead}-0badc0de": True,                 # fault marker of a dead run: swept
        f"simtest{dead}_c0.r1.{live}x1": False,            # creator alive
        f"cfm{live}p1_c0.r0.{dead}x1": False,              # a live runner's pool sweeps its own
        f"simtest{dead}_c0.r2.{dead}x2": False,            # dead but young: a receiver may still map it
        f"unrelated{dead}.r0.{dead}x1": False,             # not the simulator's
    }
    try:
        for name, stale in names.items():
            with open(f"/dev/shm/{name}", "wb") as f:
                f.write(b"x")
            if stale or "cfm" in name or "r1." in name or "unrelated" in name:
                os.utime(f"/dev/shm/{name}", (old, old))
        removed = set(shm.sweep_dead())
        assert {n for n in names if n in removed} == {n for n, stale in names.items() if stale}
    finally:
        for name in names:
            shm.unlink(name)


@pytest.mark.parametrize("requirement_id", ["SPLIT-MEMBERSHIP", "P2P-MISMATCH"])
def test_nothing_read_from_a_store_is_unpickled(requirement_id: str) -> None:
    pool = RankPool(2)
    try:
        reports = pool.run(f"{T}:split_and_p2p_without_pickle", {"requirement_id": requirement_id}, timeout_s=60)
        assert [r.status for r in reports] == ["ok", "ok"], [r.error for r in reports]
        assert [r.value["unpickles"] for r in reports] == [0, 0]
        assert [r.value["outcome"] for r in reports] == ["pass", "pass"], [r.value["detail"] for r in reports]
    finally:
        pool.close()


def test_dtype_names_resolve_through_the_table_only() -> None:
    import torch

    from simulator.dtypes import dtype_from_name
    from simulator.reduction import dtype_name

    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        assert dtype_from_name(dtype_name(dtype)) is dtype
    for name in ("Tensor", "manual_seed", "load", "__builtins__", 7):
        with pytest.raises(ValueError, match="unknown dtype name"):
            dtype_from_name(name)


def test_torchrun_rank_outcomes_travel_as_json(monkeypatch) -> None:
    import datetime
    import json
    import pickle

    import torch.distributed as dist

    from conformance.runner import inprocess
    from conformance.spec import load_catalog

    # the job's store, which the supervisor and the child that runs the check (forked: it sees the patches) share
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set_timeout(datetime.timedelta(seconds=10))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setattr(inprocess, "join", lambda timeout_s: (store, 0, 1))
    monkeypatch.setattr(inprocess, "precheck", lambda *a: None)
    value = {"rank": 0, "outcome": "pass", "detail": "", "traceback": "", "notes": ["n"], "duration_s": 0.5}
    monkeypatch.setattr(inprocess, "run_check", lambda *a, **k: dict(value))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle.loads on a store value"))
    req = next(r for r in load_catalog() if r.id == "SPLIT-MEMBERSHIP")
    (result,) = inprocess.run_requirements([req], "sim", None, 5.0)
    assert result.outcome == "pass" and result.notes == ["n"]
    assert json.loads(dist.PrefixStore("conformance/attempt0/check0/", store).get("outcome/0")) == value
