"""The pytest front door: requirement x target x world size items, markers, options, reports.

Options: ``--conformance-targets`` (default all: sim,gloo,nccl,torchcomms), ``--conformance-world-sizes``
(default 2,4), ``--conformance-timeout`` (seconds per check), ``--conformance-stack`` (the NCCL stack the sim
target models; default what this torch's ``nccl`` means), ``--conformance-report-dir`` (write
``<target>.json``/``.md`` at the end; works under pytest-xdist, the controller writes them).
Markers come from the target: ``gpu`` for every target whose class sets ``gpu`` (nccl, torchcomms, a
vendor's GPU backend), else the name of a built-in target (``sim``, ``gloo``) or ``vendor``; and one per
area. The report is built by ``session.finish_run``, as for the CLI. This process never initialises CUDA: GPU
targets count devices through NVML here and their ranks are spawned (see conformance.gpu.devices).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance import inputs
from conformance.checks.cases import DEFAULT_BUDGET, DEFAULT_SEED, Generation
from conformance.outcomes import Outcome
from conformance.report import Result, write_report
from conformance.report.build import now_iso
from conformance.runner.orchestrate import run_case
from conformance.runner.pool import PoolSet
from conformance.session import SuiteRun, finish_run, judge, load_bound_catalog, load_target_expectations, statements
from conformance.spec import Requirement
from conformance.targets import available_targets, make_target
from conformance.targets.registry import BUILTIN, target_class
from simulator.stacks import STACKS

_PROPERTY = "conformance_result"


@dataclass(frozen=True)
class Case:
    """One item: a requirement on a target at a world size."""

    requirement: Requirement
    target: str
    world_size: int
    timeout_s: float
    target_options: dict[str, Any] | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the suite's options."""
    group = parser.getgroup("conformance")
    group.addoption("--conformance-targets", default=",".join(available_targets()),
                    help="comma-separated targets (default: every known target)")
    group.addoption("--conformance-world-sizes", default="2,4", help="comma-separated world sizes")
    group.addoption("--conformance-timeout", default="30", help="per-check timeout, seconds")
    group.addoption("--conformance-stack", default="", choices=["", *STACKS],
                    help="the NCCL stack the sim target models (default: what this torch's 'nccl' means)")
    group.addoption("--conformance-report-dir", default=None, help="write <target>.json/.md here")
    group.addoption("--conformance-seed", default=str(DEFAULT_SEED), help="seed of the generated data cases")
    group.addoption("--conformance-budget", default=str(DEFAULT_BUDGET),
                    help="random generated cases per plan on top of the boundary ones (0: boundary cases only)")


def _marks(case: Case) -> list[Any]:
    return [getattr(pytest.mark, _kind(case.target)), getattr(pytest.mark, case.requirement.area)]


def _kind(target: str) -> str:
    """The marker of a target's items: ``gpu`` when its class sets ``gpu``, else a built-in target's
    name (sim, gloo, vendor: certify's), else ``vendor`` (a target a vendor's package declares)."""
    try:
        gpu = target_class(target).gpu
    except ValueError:  # an unknown name: its items report the error when they run
        return "vendor"
    return "gpu" if gpu else target if target in BUILTIN else "vendor"


def _target_options(target: str, stack: str) -> dict[str, Any] | None:
    """The sim target's options for ``--conformance-stack``; None for every other target and by default."""
    return {"stack": stack} if stack and target == "sim" else None


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
                case = Case(req, target, n, timeout, _target_options(target, cfg.getoption("--conformance-stack")))
                params.append(pytest.param(case, id=f"{req.id}-{target}-ws{n}", marks=_marks(case)))
    metafunc.parametrize("conformance_case", params)


@pytest.fixture(scope="session")
def conformance_pools() -> Any:
    """Persistent rank pools for this pytest process (one per world size)."""
    pools = PoolSet()
    yield pools
    pools.close()


def run_item(case: Case, pools: PoolSet, request: pytest.FixtureRequest) -> None:
    """Run one case, record its result for the report (as it ran: the report judges it again, with the
    others), and map its outcome, judged as the report will state it, onto pytest's."""
    ran = run_case(pools, case.requirement, case.target, case.world_size, target_options=case.target_options,
                   timeout_s=case.timeout_s)
    request.node.user_properties.append((_PROPERTY, json.dumps(ran.to_json())))
    (result,), _ = judge([ran], load_target_expectations(case.target))
    traces = "\n".join(f"--- rank {r.rank} ---\n{r.traceback}" for r in result.ranks if r.traceback)
    if result.outcome is Outcome.FAIL and case.requirement.level == "SHOULD":
        pytest.xfail(f"SHOULD not met (a finding; the verdict counts only MUSTs): {result.detail}")
    if result.outcome.failing:
        pytest.fail(f"{result.outcome}: {result.detail}\n{traces}".rstrip(), pytrace=False)
    if result.outcome in (Outcome.SKIP, Outcome.NOT_OBSERVABLE):
        pytest.skip(f"{result.outcome}: {result.detail}")
    fixed = [n for n in result.notes if n.startswith("fixed upstream")]
    if fixed:  # torch fixed what the spec's finding describes: not the backend's SHOULD pass
        pytest.skip(fixed[0])
    if result.outcome is Outcome.WAIVED:
        pytest.xfail(f"waived: {result.waiver}")


class _Collector:
    """Gathers results from items (also from xdist workers) and writes one report per target at the end."""

    def __init__(self, report_dir: Path, stack: str = "") -> None:
        self.report_dir = report_dir
        self.stack = stack  # --conformance-stack, for the sim target's report
        self.runs: dict[str, SuiteRun] = {}
        self.started = now_iso()
        self.interrupted = False
        self.finished = 0  # items whose teardown was reported

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.finished += 1
        for name, value in report.user_properties:
            if name == _PROPERTY and report.when == "call":
                result = Result.from_json(json.loads(value))
                self.runs.setdefault(result.target, SuiteRun(started=self.started)).results.append(result)

    def pytest_keyboard_interrupt(self) -> None:
        self.interrupted = True

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Fewer items finished than collected (Ctrl-C, --maxfail, or a second Ctrl-C that broke pytest's own
        # reporting, which can end with any exit status; under xdist the controller's stop flag is not the
        # session's): the report must not claim a verdict.
        ran_to_the_end = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
        if not ran_to_the_end or session.shouldstop or session.shouldfail or self.finished < session.testscollected:
            self.interrupted = True
        for target_name, run in self.runs.items():
            run.interrupted = self.interrupted
            target = make_target(target_name, _target_options(target_name, self.stack))
            write_report(finish_run(run, target, load_target_expectations(target_name)).report, self.report_dir,
                         statements())


def _validate_options(config: pytest.Config) -> None:
    """Refuse bad option values as usage errors, before any item is collected."""
    try:
        for target in (t for t in config.getoption("--conformance-targets").split(",") if t):
            target_class(target)  # raises ValueError naming the known targets
        inputs.world_sizes(config.getoption("--conformance-world-sizes"))
        inputs.timeout(config.getoption("--conformance-timeout"))
        report_dir = config.getoption("--conformance-report-dir", default=None)
        if report_dir:
            inputs.report_dir(Path(report_dir))
        generation = Generation(inputs.seed(config.getoption("--conformance-seed")),
                                inputs.budget(config.getoption("--conformance-budget")))
    except ValueError as exc:
        raise pytest.UsageError(f"conformance options: {exc}") from None
    # The rank processes this session starts inherit it (xdist workers set it alike from the same options).
    exported = contextlib.ExitStack()
    exported.enter_context(generation.exported())
    config.add_cleanup(exported.close)


def pytest_configure(config: pytest.Config) -> None:
    """Validate the options; install the report collector when a report dir is given."""
    _validate_options(config)
    report_dir = config.getoption("--conformance-report-dir", default=None)
    # Under pytest-xdist only the controller writes: it sees every worker's results; a worker sees a part.
    if report_dir and not hasattr(config, "workerinput"):
        collector = _Collector(Path(report_dir), config.getoption("--conformance-stack", default=""))
        config.pluginmanager.register(collector, "conformance-collector")
