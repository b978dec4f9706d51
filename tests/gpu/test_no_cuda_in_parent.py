"""GPU targets on the pytest/CLI side: markers from the target class, spawned rank pools, no CUDA in the parent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conformance.gpu.devices import visible_indices
from conformance.pytest_plugin import _kind
from conformance.runner import orchestrate
from conformance.runner.pool import GPU_START_METHOD, RankReport
from conformance.session import load_bound_catalog

ROOT = Path(__file__).resolve().parents[2]


def test_pytest_gpu_items_skip_without_touching_cuda_in_the_parent(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.gpu.cuda_tripwire", "-m", "gpu", "-q", "-rs",
         "-p", "no:cacheprovider", "conformance/suite", "--conformance-world-sizes", "1,2",
         "--conformance-report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert "cuda-tripwire: armed" in out
    assert "CUDA touched in the pytest parent" not in out, out[-3000:]
    assert proc.returncode == 0, out[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "passed" not in summary and "failed" not in summary
    assert "no CUDA device visible" in proc.stdout
    assert (tmp_path / "nccl.json").exists()  # the report's environment was read without CUDA too


def test_gpu_marker_comes_from_the_target_class() -> None:
    assert [_kind(t) for t in ("sim", "gloo", "nccl", "torchcomms", "no-such-target")] == [
        "sim", "gloo", "gpu", "gpu", "vendor"]


class _Pools:
    """Records which start method run_case asks for."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, str | None]] = []

    def get(self, world_size: int, start_method: str | None = None) -> _Pools:
        self.asked.append((world_size, start_method))
        return self

    def on_kill(self, name: str, cleanup: object) -> None:
        pass

    def run(self, task: str, kwargs: dict, timeout_s: float, failed: object = None) -> list[RankReport]:
        return [RankReport(0, "ok", {"rank": 0, "outcome": "pass", "detail": "", "notes": []})]


@pytest.mark.parametrize(("target", "method"), [("nccl", GPU_START_METHOD), ("torchcomms", GPU_START_METHOD),
                                                ("gloo", None), ("sim", None)])
def test_gpu_targets_get_spawned_ranks(monkeypatch: pytest.MonkeyPatch, target: str, method: str | None) -> None:
    monkeypatch.setattr(orchestrate, "precheck", lambda *_args: None)
    pools = _Pools()
    requirement = next(iter(load_bound_catalog()))
    orchestrate.run_case(pools, requirement, target, 1)  # type: ignore[arg-type]
    assert pools.asked == [(1, method)]
    assert GPU_START_METHOD in ("spawn", "forkserver")


@pytest.mark.parametrize(("spec", "uuids", "expected"), [
    (None, None, [0, 1, 2]),
    ("", None, []),
    ("2,0", None, [2, 0]),
    ("1,7,0", None, [1]),  # CUDA stops at the first entry that names no device
    ("0,0", None, []),  # a repeated device empties the list
    ("-1", None, []),
    ("GPU-bb,0", ["GPU-aa11", "GPU-bb22", "GPU-cc33"], [1, 0]),
    ("GPU-b", None, None),  # uuids needed and not read
    ("MIG-1234", None, None),
])
def test_visible_indices_follow_cuda_visible_devices(spec: str | None, uuids: list[str] | None,
                                                      expected: list[int] | None) -> None:
    assert visible_indices(spec, 3, uuids) == expected


def test_a_spawned_pool_runs_tasks_apart_from_the_fork_pool() -> None:
    from conformance.runner import PoolSet

    pools = PoolSet()
    try:
        spawned = pools.get(2, GPU_START_METHOD)
        assert spawned is not pools.get(2) and spawned is pools.get(2, GPU_START_METHOD)
        reports = spawned.run("tests.runner.tasks:echo", {"value": 7}, timeout_s=60)
        assert [(r.status, r.value["rank"], r.value["value"]) for r in reports] == [("ok", 0, 7), ("ok", 1, 7)]
        assert [r.value["pid"] for r in reports] == spawned.pids
    finally:
        pools.close()


class _OneRankPools(_Pools):
    """As _Pools, for the torchrun supervisor: fresh pools too, and the task's kwargs kept."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[tuple[str, dict]] = []

    def fresh(self, world_size: int, start_method: str | None = None) -> _OneRankPools:
        self.asked.append((world_size, f"fresh:{start_method}"))
        return self

    def run(self, task: str, kwargs: dict, timeout_s: float, failed: object = None) -> list[RankReport]:
        self.tasks.append((task, kwargs))
        return super().run(task, kwargs, timeout_s, failed)

    def close(self) -> None:
        pass


def test_torchrun_supervisor_runs_gpu_checks_in_spawned_children_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import torch.distributed as dist

    from conformance.runner import inprocess
    from conformance.targets.nccl import NcclTarget

    for name in ("is_available", "device_count", "init", "_lazy_init", "set_device", "current_device"):
        monkeypatch.setattr(torch.cuda, name,
                            lambda *_a, _n=name, **_k: pytest.fail(f"torch.cuda.{_n}() in the supervisor"))
    store = dist.HashStore()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    monkeypatch.setattr(inprocess, "join", lambda timeout_s: (store, 0, 1))
    monkeypatch.setattr(inprocess, "precheck", lambda *_a: None)
    pools = _OneRankPools()
    monkeypatch.setattr(inprocess, "PoolSet", lambda: pools)
    catalog = {r.id: r for r in load_bound_catalog()}
    isolated = sorted(NcclTarget.fresh_process_checks)[0]
    results = inprocess.run_requirements([catalog["COLL-ALLREDUCE-OPS"], catalog[isolated]], "nccl", None, 5.0)
    assert [r.outcome.value for r in results] == ["pass", "pass"]
    assert pools.asked == [(1, GPU_START_METHOD), (1, f"fresh:{GPU_START_METHOD}")]
    (task, kwargs), _ = pools.tasks
    assert task == inprocess.TASK and (kwargs["job_rank"], kwargs["host"], kwargs["port"]) == (0, "127.0.0.1", 29555)


def test_nccl_checks_that_split_get_processes_of_their_own() -> None:
    # torch 2.11's split_group segfaulted after a destroy and re-init in one process (NCCL 2.28.9, H200)
    from conformance.targets.nccl import NcclTarget
    from conformance.targets.sim import SimTarget

    catalog = {r.id: r for r in load_bound_catalog()}
    splitting = [r for r in catalog.values() if "split" in r.capabilities]
    assert splitting and all(NcclTarget.isolates(NcclTarget(), r) for r in splitting)
    assert not NcclTarget.isolates(NcclTarget(), catalog["COLL-ALLREDUCE-OPS"])
    assert not any(SimTarget.isolates(SimTarget(), r) for r in splitting)
