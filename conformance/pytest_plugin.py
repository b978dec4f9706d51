"""The pytest front door: requirement x target x world size items, markers, options, reports.

Options: ``--conformance-targets`` (default all: sim,gloo,nccl,torchcomms), ``--conformance-world-sizes``
(default 2,4), ``--conformance-timeout`` (seconds per check), ``--conformance-report-dir`` (write
``<target>.json``/``.md`` at the end; works under pytest-xdist, the controller writes them).
Markers: ``sim``, ``gloo``, ``gpu`` (every target whose class sets ``gpu``: nccl, torchcomms, a
vendor's GPU backend), ``vendor``, and one per area. This process never initialises CUDA: GPU
targets count devices through NVML here and their ranks are spawned (see conformance.gpu.devices).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance import inputs
from conformance.report import (
    Result,
    apply_expectations,
    build_report,
    collect_environment,
    write_report,
)
from conformance.runner.orchestrate import run_case
from conformance.runner.pool import PoolSet
from conformance.session import fixed_upstream, load_bound_catalog, load_target_expectations, statements
from conformance.spec import Requirement
from conformance.targets import available_targets, make_target
from conformance.targets.registry import target_class

_PROPERTY = "conformance_result"
_STALE = "conformance_stale_waiver"


@dataclass(frozen=True)
class Case:
    """One item: a requirement on a target at a world size."""

    requirement: Requirement
    target: str
    world_size: int
    timeout_s: float


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the suite's options."""
    group = parser.getgroup("conformance")
    group.addoption("--conformance-targets", default=",".join(available_targets()),
                    help="comma-separated targets (default: every known target)")
    group.addoption("--conformance-world-sizes", default="2,4", help="comma-separated world sizes")
    group.addoption("--conformance-timeout", default="30", help="per-check timeout, seconds")
    group.addoption("--conformance-report-dir", default=None, help="write <target>.json/.md here")


def _marks(case: Case) -> list[Any]:
    return [getattr(pytest.mark, _kind(case.target)), getattr(pytest.mark, case.requirement.area)]


def _kind(target: str) -> str:
    """The marker of a target: its name for sim and gloo, else gpu (the class's ``gpu``) or vendor."""
    if target in ("sim", "gloo"):
        return target
    try:
        return "gpu" if target_class(target).gpu else "vendor"
    except ValueError:  # an unknown name: its items report the error when they run
        return "vendor"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``conformance_case`` over the catalog, the targets and the world sizes."""
    if "conformance_case" not in metafunc.fixturenames:
        return
    cfg = metafunc.config
    targets = [t for t in cfg.getoption("--conformance-targets").split(",") if t]
    sizes = inputs.world_sizes(cfg.getoption("--conformance-world-sizes"))
    timeout = inputs.timeout(cfg.getoption("--conformance-timeout"))
    params = []
    for req in load_bound_catalog():
        for target in targets:
            for n in sizes:
                case = Case(req, target, n, timeout)
                params.append(pytest.param(case, id=f"{req.id}-{target}-ws{n}", marks=_marks(case)))
    metafunc.parametrize("conformance_case", params)


@pytest.fixture(scope="session")
def conformance_pools() -> Any:
    """Persistent rank pools for this pytest process (one per world size)."""
    pools = PoolSet()
    yield pools
    pools.close()


def run_item(case: Case, pools: PoolSet, request: pytest.FixtureRequest) -> None:
    """Run one case, record its result for the report, and map its outcome onto pytest's."""
    result = run_case(pools, case.requirement, case.target, case.world_size, timeout_s=case.timeout_s)
    (result,), stale = apply_expectations([result], load_target_expectations(case.target))
    (result,) = fixed_upstream([result])
    request.node.user_properties.append((_PROPERTY, json.dumps(result.to_json())))
    for entry in stale:
        request.node.user_properties.append((_STALE, json.dumps({"target": case.target, "entry": entry})))
    traces = "\n".join(f"--- rank {r['rank']} ---\n{r['traceback']}" for r in result.ranks if r.get("traceback"))
    if result.outcome == "fail" and case.requirement.level == "SHOULD":
        pytest.xfail(f"SHOULD not met (a finding; the verdict counts only MUSTs): {result.detail}")
    if result.outcome in ("fail", "error"):
        pytest.fail(f"{result.outcome}: {result.detail}\n{traces}".rstrip(), pytrace=False)
    if result.outcome in ("skip", "not-observable"):
        pytest.skip(f"{result.outcome}: {result.detail}")
    fixed = [n for n in result.notes if n.startswith("fixed upstream")]
    if fixed:  # torch fixed what the spec's finding describes: not the backend's SHOULD pass
        pytest.skip(fixed[0])
    if result.outcome == "waived":
        pytest.xfail(f"waived: {result.waiver}")


class _Collector:
    """Gathers results from items (also from xdist workers) and writes reports at the end."""

    def __init__(self, report_dir: Path) -> None:
        self.report_dir = report_dir
        self.results: dict[str, list[Result]] = {}
        self.stale: dict[str, list[dict[str, Any]]] = {}
        self.interrupted = False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == _PROPERTY and report.when == "call":
                result = Result.from_json(json.loads(value))
                self.results.setdefault(result.target, []).append(result)
            elif name == _STALE and report.when == "call":
                stale = json.loads(value)
                self.stale.setdefault(stale["target"], []).append(stale["entry"])

    def pytest_keyboard_interrupt(self) -> None:
        self.interrupted = True

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.INTERRUPTED or session.shouldstop or session.shouldfail:
            self.interrupted = True  # fewer results than items: the report must not claim a verdict
        for target, results in self.results.items():
            environment = collect_environment(make_target(target).environment()) if target != "vendor" else \
                collect_environment()
            report = build_report(target, results, environment, interrupted=self.interrupted,
                                  stale_waivers=self.stale.get(target, ()))
            write_report(report, self.report_dir, statements())


def _validate_options(config: pytest.Config) -> None:
    """Refuse bad option values as usage errors, before any item is collected."""
    try:
        for target in (t for t in config.getoption("--conformance-targets").split(",") if t):
            if target not in available_targets() and target != "vendor":
                make_target(target)  # raises ValueError naming the known targets
        inputs.world_sizes(config.getoption("--conformance-world-sizes"))
        inputs.timeout(config.getoption("--conformance-timeout"))
        report_dir = config.getoption("--conformance-report-dir", default=None)
        if report_dir:
            inputs.report_dir(Path(report_dir))
    except ValueError as exc:
        raise pytest.UsageError(f"conformance options: {exc}") from None


def pytest_configure(config: pytest.Config) -> None:
    """Validate the options; install the report collector when a report dir is given."""
    _validate_options(config)
    report_dir = config.getoption("--conformance-report-dir", default=None)
    # Under pytest-xdist only the controller writes: it sees every worker's results; a worker sees a part.
    if report_dir and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Collector(Path(report_dir)), "conformance-collector")
