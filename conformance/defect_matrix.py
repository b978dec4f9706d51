"""The defect matrix: the suite's own power, measured on the simulator.

Runs the suite once clean and once per planted defect (every simulator switch, plus a
framework-side mutant for derived groups), and checks three targets: every defect is caught by
at least one MUST requirement, every requirement the simulator can observe is caught by at least
one defect, and the clean simulator passes every MUST. Requirements that can only be judged on
torch's front end, or that the simulator cannot observe, are listed with the reason.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

import simulator
from conformance import frontend_mutants
from conformance.cli import ExitCode
from conformance.outcomes import Outcome
from conformance.report.write import atomic_write_text
from conformance.runner.pool import PoolSet
from conformance.session import SuiteRun, load_bound_catalog, run_suite
from conformance.torch_compat import TORCH, defect_inapplicable


@dataclass(frozen=True)
class Mutant:
    """One planted defect: a simulator switch or an environment override."""

    name: str
    description: str
    defects: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def inapplicable(mutant: Mutant) -> str | None:
    """Why ``mutant`` plants no defect on the running torch, or None."""
    return next(filter(None, (defect_inapplicable(d) for d in (mutant.name, *mutant.defects))), None)


def mutants() -> list[Mutant]:
    """Every simulator defect switch, the front-end mutants, and the derived-groups builder mutant."""
    found = [Mutant(name, text, defects=(name,)) for name, text in simulator.defects.DEFECTS.items()]
    found += [Mutant(name, text, env={frontend_mutants.ENV: name})
              for name, (text, _) in frontend_mutants.MUTANTS.items()]
    found.append(Mutant(
        "derived_groups_fixed_order",
        "derived groups rebuilt with a hard-coded tp-cp-ep-dp-pp order and no offset (Megatron PR 3249)",
        env={"CONFORMANCE_GROUP_BUILDER": "conformance.checks.derived_groups:hardcoded_order_builder"},
    ))
    return found


def _outcomes(run: SuiteRun) -> dict[str, Outcome]:
    """Requirement id -> worst outcome over the world sizes it ran at."""
    worst: dict[str, Outcome] = {}
    for r in run.results:
        if r.requirement not in worst or r.outcome.severity > worst[r.requirement].severity:
            worst[r.requirement] = r.outcome
    return worst


def _caught(outs: dict[str, str], clean: dict[str, str]) -> list[str]:
    """The requirements that pass clean and fail (or error) under a defect."""
    return [rid for rid, o in outs.items() if Outcome(o).failing and clean.get(rid) == Outcome.PASS]


def build_matrix(clean: dict[str, str], mutated: dict[str, dict[str, str]], levels: dict[str, str],
                 fixed_upstream: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The matrix and the three verdicts, from clean and per-mutant outcomes.

    ``fixed_upstream``: requirements whose spec finding no longer holds on this torch; their pass
    is torch's front end having fixed the finding, not a backend behaviour a defect could break.
    """
    caught = {m: _caught(outs, clean) for m, outs in mutated.items()}
    caught_by_must = {m: [rid for rid in rids if levels[rid] == "MUST"] for m, rids in caught.items()}
    killers = {rid: [m for m, rids in caught.items() if rid in rids] for rid in clean}
    observable = [rid for rid, o in clean.items() if o == Outcome.PASS and rid not in fixed_upstream]
    unkilled = [rid for rid in observable if not killers[rid]]
    must_clean_bad = [rid for rid, o in clean.items() if levels[rid] == "MUST" and Outcome(o).failing]
    return {
        "clean": clean,
        "mutants": {m: {"outcomes": mutated[m], "caught_by": caught[m], "caught_by_must": caught_by_must[m]}
                    for m in mutated},
        "killers": killers,
        "kill_rate": sum(bool(v) for v in caught_by_must.values()) / max(1, len(caught_by_must)),
        "teeth_rate": (len(observable) - len(unkilled)) / max(1, len(observable)),
        "uncaught_mutants": [m for m, v in caught_by_must.items() if not v],
        "requirements_without_teeth": unkilled,
        "not_judged_on_sim": {rid: o for rid, o in clean.items() if o != Outcome.PASS},
        "fixed_upstream": sorted(rid for rid in fixed_upstream if clean.get(rid) == Outcome.PASS),
        "clean_must_failures": must_clean_bad,
    }


def render(matrix: dict[str, Any]) -> str:
    """Markdown: defect x requirement, with what caught each defect."""
    reqs = list(matrix["clean"])
    lines = [f"# Defect matrix (simulator, torch {matrix.get('torch', '?')})", "",
             f"- defects caught by a MUST requirement: {matrix['kill_rate']:.0%}",
             f"- requirements observable on the simulator caught by some defect: {matrix['teeth_rate']:.0%}",
             f"- clean simulator MUST failures: {matrix['clean_must_failures'] or 'none'}", "",
             "| defect | caught by |", "| --- | --- |"]
    for name, row in matrix["mutants"].items():
        lines.append(f"| `{name}` | {', '.join(row['caught_by']) or '**NOT CAUGHT**'} |")
    for name, reason in matrix.get("not_applicable", {}).items():
        lines.append(f"| `{name}` | not applicable on this torch: {reason} |")
    lines += ["", "| requirement | clean | caught by defects |", "| --- | --- | --- |"]
    for rid in reqs:
        lines.append(f"| {rid} | {matrix['clean'][rid]} | {', '.join(matrix['killers'][rid]) or '-'} |")
    if matrix.get("fixed_upstream"):
        lines += ["", "Fixed upstream on this torch (the spec's finding no longer holds: torch's front end passes "
                  "them, no backend defect can break them, so they are not counted for teeth):", ""]
        lines += [f"- {rid}" for rid in matrix["fixed_upstream"]]
    if matrix["not_judged_on_sim"]:
        lines += ["", "Not judged on the simulator (skip / not-observable there, or failing on torch 2.13's "
                  "front end before any backend is reached, see the spec's `finding`):", ""]
        lines += [f"- {rid}: {o}" for rid, o in matrix["not_judged_on_sim"].items()]
    return "\n".join(lines) + "\n"


def _interrupted(say: Any, report_dir: Path) -> ExitCode:
    say(f"interrupted: the matrix is incomplete, {report_dir / 'defects.json'} and .md are left as they were")
    return ExitCode.INCOMPLETE  # as for an interrupted `run`


def run_matrix(world_sizes: list[int], report_dir: Path, timeout_s: float, progress: Console | None = None) -> ExitCode:
    """Run clean + every mutant, write reports/defects.{json,md}; exit 1 unless all three targets hold.

    An interrupted matrix writes nothing (a partial one would report the unrun checks as misses): exit 3.
    """
    catalog = load_bound_catalog()
    levels = {r.id: r.level for r in catalog}
    fixed = frozenset(r.id for r in catalog if r.finding and not r.finding_holds(str(TORCH)))
    pools = PoolSet()
    say = progress.print if progress else (lambda *a, **k: None)
    try:
        say("clean run ...")
        run = run_suite("sim", world_sizes, pools=pools, timeout_s=timeout_s, smallest_size_only=True)
        if run.interrupted:
            return _interrupted(say, report_dir)
        clean = _outcomes(run)
        mutated: dict[str, dict[str, str]] = {}
        not_applicable = {m.name: why for m in mutants() if (why := inapplicable(m))}
        all_mutants = [m for m in mutants() if m.name not in not_applicable]
        for i, m in enumerate(all_mutants, 1):
            run = run_suite("sim", world_sizes, pools=pools, timeout_s=timeout_s, smallest_size_only=True,
                            target_options={"defects": list(m.defects)}, env=m.env or None)
            if run.interrupted:  # an interrupted run would count its unrun checks as misses
                return _interrupted(say, report_dir)
            outs = _outcomes(run)
            mutated[m.name] = outs
            hit = _caught(outs, clean)
            say(f"[{i:>2}/{len(all_mutants)}] {m.name:<28} caught by {', '.join(hit) or 'NOTHING'}")
    finally:
        pools.close()
    matrix = build_matrix(clean, mutated, levels, fixed)
    matrix["descriptions"] = {m.name: m.description for m in mutants()}
    matrix["not_applicable"] = not_applicable
    matrix["torch"] = str(TORCH)
    matrix["generated"] = dt.datetime.now(dt.UTC).isoformat()
    report_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(report_dir / "defects.json", json.dumps(matrix, indent=2, sort_keys=True))
    atomic_write_text(report_dir / "defects.md", render(matrix))
    ok = not (matrix["uncaught_mutants"] or matrix["requirements_without_teeth"] or matrix["clean_must_failures"])
    say(f"kill rate {matrix['kill_rate']:.0%}, teeth {matrix['teeth_rate']:.0%}, "
        f"clean MUST failures {len(matrix['clean_must_failures'])} -> {'OK' if ok else 'FAILED'}")
    return ExitCode.OK if ok else ExitCode.NON_CONFORMANT
