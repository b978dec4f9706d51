"""Run a set of requirements on one target at several world sizes, with progress, into a report."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from conformance import interrupts
from conformance.checks import bind_checks
from conformance.checks.cases import Generation
from conformance.outcomes import Outcome
from conformance.report import (
    Expectation,
    Result,
    apply_expectations,
    build_report,
    collect_environment,
    load_expectations,
    out_of_range,
)
from conformance.report.build import now_iso
from conformance.runner.inprocess import run_requirements
from conformance.runner.orchestrate import run_case
from conformance.runner.pool import PoolSet
from conformance.spec import Requirement, SpecError, load_catalog
from conformance.targets import CAPABILITIES, Target, make_target

Progress = Callable[[Result], None]


@dataclass
class Selection:
    """Which requirements to run: by area and/or id (empty means all)."""

    areas: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()

    def pick(self, catalog: list[Requirement]) -> list[Requirement]:
        """The requirements selected, in catalog order; unknown ids and areas are an error."""
        known_ids = {r.id for r in catalog}
        known_areas = {r.area for r in catalog}
        bad = [i for i in self.ids if i not in known_ids] + [a for a in self.areas if a not in known_areas]
        if bad:
            raise ValueError(f"unknown requirement id(s) or area(s): {bad}")
        return [r for r in catalog if (not self.areas or r.area in self.areas) and (not self.ids or r.id in self.ids)]


@dataclass
class SuiteRun:
    """A suite run on one target: its results, whether it was interrupted, and (once finished) the report."""

    results: list[Result] = field(default_factory=list)
    interrupted: bool = False
    started: str = field(default_factory=now_iso)
    report: dict[str, Any] = field(default_factory=dict)
    stale: list[dict[str, Any]] = field(default_factory=list)
    out_of_range: list[dict[str, Any]] = field(default_factory=list)
    # The seed and budget of the generated data cases (None: a run without any, e.g. the framework's).
    generation: dict[str, int] | None = field(default_factory=lambda: Generation.from_env().to_json())


def load_bound_catalog() -> list[Requirement]:
    """The catalog, validated and paired with its checks (fails loudly on any mismatch).

    A capability the targets do not know (a typo) is a SpecError: it would skip the requirement everywhere.
    """
    catalog = load_catalog()
    for req in catalog:
        for cap in req.capabilities:
            if cap not in CAPABILITIES:
                raise SpecError(f"{req.area}.toml", req.id, "capabilities",
                                f"unknown capability {cap!r}; known: {', '.join(sorted(CAPABILITIES))}")
    bind_checks(catalog)
    return catalog


def load_target_expectations(target_name: str) -> list[Expectation]:
    """The expectation entries of target ``target_name``; one naming a requirement the spec lacks is a SpecError."""
    entries = load_expectations(target_name)
    known = {r.id for r in load_catalog()}
    for entry in entries:
        if entry.requirement not in known:
            raise SpecError(entry.file or f"{target_name}.toml", entry.requirement, "requirement",
                            "no such requirement in the spec")
    return entries


def statements(torch_version: str | None = None) -> dict[str, str]:
    """Requirement id -> its statement, with the spec's finding as it stands on this torch appended."""
    version = torch_version or torch.__version__
    return {r.id: " ".join(filter(None, (r.statement, r.finding_text(version)))) for r in load_catalog()}


def fixed_upstream(results: list[Result], torch_version: str | None = None) -> list[Result]:
    """Mark passes of requirements whose spec finding no longer holds on this torch as fixed upstream.

    Such a pass is torch's front end having fixed what the finding describes, not the backend
    meeting a SHOULD; the note says which torch range the finding held in.
    """
    version = torch_version or torch.__version__
    fixed = {r.id: r for r in load_catalog() if r.finding and not r.finding_holds(version)}
    def mark(result: Result) -> Result:
        req = fixed.get(result.requirement)
        if req is None or result.outcome is not Outcome.PASS:
            return result
        note = f"fixed upstream: the spec's finding held on torch {req.finding_torch}, not on {version}"
        return replace(result, notes=[*result.notes, note])

    return [mark(r) for r in results]


def run_suite(
    target_name: str,
    world_sizes: Iterable[int],
    *,
    selection: Selection | None = None,
    target_options: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
    pools: PoolSet | None = None,
    progress: Progress | None = None,
    launcher: str = "pool",
) -> SuiteRun:
    """Run the selected requirements on target ``target_name`` at each world size and build the report.

    ``launcher="env"`` runs in-process as one rank of a torchrun job (the world size is torchrun's);
    only rank 0 gets a report. Ctrl-C (or SIGTERM with ``interrupts.install()``) stops the run: what finished
    is kept, the verdict is ``incomplete``.
    """
    catalog = load_bound_catalog()
    chosen = (selection or Selection()).pick(catalog)
    target, expectations = make_target(target_name, target_options), load_target_expectations(target_name)
    run = SuiteRun()
    if launcher == "env":
        try:
            with interrupts.raising():
                results = run_requirements(chosen, target_name, target_options, timeout_s)
        except KeyboardInterrupt:  # the job's ranks stop together; rank 0 has no complete set to report
            run.interrupted = True
            return run
        if results is None:
            return run
        run.results = results
        return finish_run(run, target, expectations)
    sizes = sorted(set(world_sizes))
    own_pools = pools is None
    pools = pools or PoolSet()
    try:
        with interrupts.raising():
            for req in chosen:
                for n in sizes:
                    result = run_case(pools, req, target_name, n, target_options=target_options,
                                      timeout_s=timeout_s)
                    if interrupts.requested():  # a signal during the case: its result is not to be trusted
                        raise KeyboardInterrupt(interrupts.requested())
                    run.results.append(result)
                    if progress:
                        progress(result)
    except KeyboardInterrupt:
        run.interrupted = True
    except Exception:
        if not interrupts.requested():
            raise
        run.interrupted = True  # e.g. a rank process that the Ctrl-C reached while it started
    finally:
        if own_pools:
            pools.close()
    return finish_run(run, target, expectations)


def judge(results: list[Result], expectations: list[Expectation]) -> tuple[list[Result], list[dict[str, Any]]]:
    """The results as the report states them: the target's expectations applied (a known failure is
    waived), passes of fixed-upstream findings noted; and the stale waivers found."""
    results, stale = apply_expectations(results, expectations, strict=False)
    return fixed_upstream(results), stale


def finish_run(run: SuiteRun, target: Target, expectations: Sequence[Expectation] = ()) -> SuiteRun:
    """Judge the run's results against ``expectations`` (the target's known failures,
    ``load_target_expectations``) and build the report of ``target``: the one path of the CLI, torchrun, pytest
    and the framework front door.

    ``run.results`` are the cases as they ran; afterwards they are as the report states them.
    """
    run.results, run.stale = judge(run.results, list(expectations))
    run.out_of_range = out_of_range(list(expectations))
    environment = collect_environment(target.environment())
    run.report = build_report(target.name, run.results, environment, interrupted=run.interrupted,
                              started=run.started, stale_waivers=run.stale, out_of_range_waivers=run.out_of_range,
                              capabilities=target.capabilities, generation=run.generation)
    return run

