"""The defect matrix: the suite's own power, measured on the simulator.

Runs the suite once clean and once per planted defect (every simulator switch, the front-end mutants
and a defective group builder, all in ``conformance.planted``), and checks three targets: every defect
is caught by at least one MUST requirement, every requirement the simulator can observe is caught by at
least one defect, and the clean simulator passes every MUST. Requirements that can only be judged on
torch's front end, or that the simulator cannot observe, are listed with the reason.

A simulator switch runs only against the checks whose clean run consulted it, and a front-end mutant only
against those whose clean run called a function it replaces: a defect a check never meets cannot change what
the check does, so there its outcome is the clean one (listed under ``inferred``; ``everything=True`` runs
every pair instead). Cases run in parallel lanes.

``first_catch`` answers only the three verdicts, in fewer cases (CI's guard): a planted case is skipped once its
defect is caught by a MUST requirement and its requirement has caught some defect, and where its requirement does
not pass clean (it cannot catch there); the "caught by" lists are then partial, and the report says so. Its cases
run in an order that finds catches early: first each defect against the requirements that caught it in an earlier
matrix (``earlier_catches`` of a defects.json), then the rest, cheapest clean check first. The order changes which
cases are skipped, never a verdict.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from conformance import interrupts
from conformance.outcomes import Outcome
from conformance.planted.lanes import Case, CaseOutcome, Lanes
from conformance.planted.mutants import Mutant, mutants
from conformance.report.write import atomic_write_text
from conformance.session import load_bound_catalog
from conformance.spec import Requirement
from conformance.torch_compat import TORCH, default_stack
from conformance.verdict import ExitCode

LANES = 4  # cases run at once: most of a planted defect's time is a peer waiting out its timeout
CLEAN_RETRY_PATIENCE = 5.0  # a clean case that ran out of time runs again alone, with this many times the timeout
# (3 was too few once P2P-DATA sent 1030 messages one at a time: 24 s alone, while pytest-xdist ran two more workers)

__all__ = ["Mutant", "build_matrix", "mutants", "render", "run_matrix"]


def _catches(outcome: str, clean_outcome: str | None) -> bool:
    """A requirement catches a defect when it passes clean and fails (or errors) under the defect."""
    return Outcome(outcome).failing and clean_outcome == Outcome.PASS


def _caught(outs: dict[str, str], clean: dict[str, str]) -> list[str]:
    """The requirements that catch a defect, from its outcomes."""
    return [rid for rid, o in outs.items() if _catches(o, clean.get(rid))]


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
    lines = [f"# Defect matrix (simulator, stack {matrix.get('stack', '?')}, torch {matrix.get('torch', '?')})", "",
             f"- defects caught by a MUST requirement: {matrix['kill_rate']:.0%}",
             f"- requirements observable on the simulator caught by some defect: {matrix['teeth_rate']:.0%}",
             f"- clean simulator MUST failures: {matrix['clean_must_failures'] or 'none'}",
             f"- clean cases run again alone after an error: {matrix.get('clean_retried') or 'none'}",
             *([f"- first catch only: {sum(map(len, matrix['skipped'].values()))} planted cases skipped once they "
                "could change no verdict, so each 'caught by' list is partial"] if matrix.get("first_catch") else []),
             "", "| defect | caught by |", "| --- | --- |"]
    for name, row in matrix["mutants"].items():
        lines.append(f"| `{name}` | {', '.join(row['caught_by']) or '**NOT CAUGHT**'} |")
    for name, reason in matrix.get("not_applicable", {}).items():
        lines.append(f"| `{name}` | not applicable: {reason} |")
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


def _consulted(folder: Path) -> dict[str, set[str]]:
    """Requirement id -> the simulator switches any rank consulted, and the front-end mutants whose functions any
    rank called, in its clean run."""
    found: dict[str, set[str]] = {}
    for path in folder.glob("*.rank*.json"):
        found.setdefault(path.name.split(".rank")[0], set()).update(json.loads(path.read_text()))
    return found


def _unreached(planted: list[Mutant], consulted: dict[str, set[str]], stack: str) -> dict[str, str]:
    """The simulator defects no clean check on ``stack`` consulted: the stack never runs the methods they
    override (nccl2 makes no lazy pair communicators, so a flawed lazy-P2P warning cannot show), so they plant
    nothing there; each with the methods it overrides."""
    seen = set().union(*consulted.values()) if consulted else set()
    return {m.name: f"stack {stack} never runs what it overrides ({m.overridden()})" for m in planted
            if m.in_simulator and not set(m.defects) & seen}


def plan(catalog: list[Requirement], sizes: list[int], planted: list[Mutant], consulted: dict[str, set[str]],
         everything: bool = False) -> list[Case]:
    """The cases to run: each simulator switch or front-end mutant against the requirements whose clean run met
    it (``Mutant.recorded_as``), the builder mutant against every requirement (every pair with ``everything``)."""
    return [Case(r.id, r.smallest_world_size(sizes), m.name) for m in planted for r in catalog
            if everything or not m.recorded_as or set(m.recorded_as) & consulted.get(r.id, set())]


class _FirstCatch:
    """First-catch mode's bookkeeping: which defects a MUST requirement caught and which requirements caught one
    so far, and the cases left out because neither can change any more."""

    def __init__(self, clean: dict[str, str], levels: dict[str, str]) -> None:
        self._clean, self._levels = clean, levels
        self._caught: set[str] = set()
        self._toothed: set[str] = set()
        self.skipped: dict[str, list[str]] = {}

    def record(self, o: CaseOutcome) -> None:
        if _catches(o.outcome, self._clean[o.case.requirement]):
            self._toothed.add(o.case.requirement)
            if self._levels[o.case.requirement] == "MUST":
                self._caught.add(o.case.mutant)

    def wanted(self, case: Case) -> bool:
        """Whether ``case`` can still change a verdict (its outcome is recorded as skipped otherwise)."""
        rid = case.requirement
        want = self._clean[rid] == Outcome.PASS and (case.mutant not in self._caught or rid not in self._toothed)
        if not want:
            self.skipped.setdefault(case.mutant, []).append(rid)
        return want


def earlier_catches(path: Path) -> dict[str, list[str]]:
    """Defect -> the requirements that caught it, from an earlier matrix's defects.json."""
    try:
        earlier = json.loads(path.read_text())["mutants"]
        return {m: list(row["caught_by"]) for m, row in earlier.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--order-from {path}: not a defects.json the matrix wrote ({exc})") from None


def catches_first(cases: list[Case], earlier: dict[str, list[str]], clean_s: dict[str, float]) -> list[Case]:
    """``cases`` with each defect's earlier catches first, then the rest; cheapest clean check first within each."""
    return sorted(cases, key=lambda c: (c.requirement not in earlier.get(c.mutant, ()), clean_s.get(c.requirement, 0)))


def run_matrix(world_sizes: list[int], report_dir: Path, timeout_s: float, progress: Console | None = None,
               lanes: int = LANES, everything: bool = False, stop_early: bool = True, stack: str = "",
               first_catch: bool = False, earlier: dict[str, list[str]] | None = None) -> ExitCode:
    """Run clean + every mutant, write reports/defects.{json,md}; exit 1 unless all three targets hold.

    ``stop_early``: a planted case ends once a rank fails (see ``Lanes``); off, its peers run to their end.
    ``first_catch``: only the cases that can still change a verdict, each defect first against the requirements
    that caught it in an ``earlier`` matrix (see the module's docstring).
    ``stack``: the NCCL stack the simulator models (default: what this torch's ``nccl`` means).

    An interrupted matrix writes nothing (a partial one would report the unrun checks as misses): exit 3.
    """
    stack = stack or default_stack()
    catalog = load_bound_catalog()
    levels = {r.id: r.level for r in catalog}
    fixed = frozenset(r.id for r in catalog if r.finding and not r.finding_holds(str(TORCH)))
    sizes = sorted(set(world_sizes))
    say = progress.print if progress else (lambda *a, **k: None)
    every = mutants()
    not_applicable = {m.name: why for m in every if (why := m.inapplicable(stack))}
    planted = [m for m in every if m.name not in not_applicable]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cfm-matrix-") as folder:
        pool = Lanes(max(1, lanes), timeout_s, folder, stop_early, stack)
        try:
            with interrupts.raising():
                say("clean run ...")
                clean_runs = pool.run([Case(r.id, r.smallest_world_size(sizes)) for r in catalog])
                retried = _retry_unjudged(pool, clean_runs, timeout_s, say)
                clean_runs = [retried.get(o.case.requirement, o) for o in clean_runs]
                by_req = {o.case.requirement: o.outcome for o in clean_runs}
                clean = {r.id: by_req[r.id] for r in catalog}
                consulted = _consulted(Path(folder))
                unreached = _unreached(planted, consulted, stack)
                not_applicable.update(unreached)
                planted = [m for m in planted if m.name not in unreached]
                cases = plan(catalog, sizes, planted, consulted, everything)
                tracker = None
                if first_catch:
                    tracker = _FirstCatch(clean, levels)
                    cases = catches_first(cases, earlier or {},
                                          {o.case.requirement: o.duration_s for o in clean_runs})
                report = _Progress(say, cases, clean, tracker)
                runs = pool.run(cases, report, wanted=report.wanted)
        except KeyboardInterrupt:
            pool.close(at_once=True)
            return _interrupted(say, report_dir)
        finally:
            pool.close()
    mutated = {m.name: dict(clean) for m in planted}
    ran: dict[str, set[str]] = {m.name: set() for m in planted}
    seconds = dict.fromkeys(ran, 0.0)
    for o in runs:
        mutated[o.case.mutant][o.case.requirement] = o.outcome
        ran[o.case.mutant].add(o.case.requirement)
        seconds[o.case.mutant] += o.duration_s
    matrix = build_matrix(clean, mutated, levels, fixed)
    matrix["descriptions"] = {m.name: m.description for m in every}
    matrix["clean_retried"] = sorted(retried)
    matrix["clean_failure_details"] = {rid: o.detail for o in clean_runs
                                       if (rid := o.case.requirement) in matrix["clean_must_failures"]}
    matrix["not_applicable"] = not_applicable
    skipped = tracker.skipped if tracker else {}
    matrix["first_catch"] = first_catch
    matrix["skipped"] = {m: sorted(rids) for m, rids in skipped.items()}
    matrix["inferred"] = {m: left for m, rids in ran.items()
                          if (left := sorted(set(clean) - rids - set(skipped.get(m, ()))))}
    matrix["seconds"] = {m: round(t, 2) for m, t in seconds.items()}
    matrix["torch"] = str(TORCH)
    matrix["stack"] = stack
    matrix["generated"] = dt.datetime.now(dt.UTC).isoformat()
    report_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(report_dir / "defects.json", json.dumps(matrix, indent=2, sort_keys=True))
    atomic_write_text(report_dir / "defects.md", render(matrix))
    ok = not (matrix["uncaught_mutants"] or matrix["requirements_without_teeth"] or matrix["clean_must_failures"])
    say(f"kill rate {matrix['kill_rate']:.0%}, teeth {matrix['teeth_rate']:.0%}, "
        f"clean MUST failures {len(matrix['clean_must_failures'])} -> {'OK' if ok else 'FAILED'} "
        f"({len(clean_runs)} clean and {len(runs)} planted cases in {time.perf_counter() - started:.1f} s)")
    return ExitCode.OK if ok else ExitCode.NON_CONFORMANT


def _retry_unjudged(pool: Lanes, clean_runs: list[CaseOutcome], timeout_s: float,
                    say: Callable[..., None]) -> dict[str, CaseOutcome]:
    """Clean cases that ended in an error (a timeout, most often: four lanes of ranks share the cores) run again,
    one at a time, with ``CLEAN_RETRY_PATIENCE`` times the timeout: the clean run is the baseline every catch is
    measured against, so it must be a verdict, not the machine's load. A second error stands."""
    again: dict[str, CaseOutcome] = {}
    for o in clean_runs:
        if o.outcome == Outcome.ERROR:
            say(f"clean {o.case.requirement} ws={o.case.world_size} ended without a verdict "
                f"({o.detail.splitlines()[0] if o.detail else 'no detail'}); running it again alone")
            case = Case(o.case.requirement, o.case.world_size, timeout_s=timeout_s * CLEAN_RETRY_PATIENCE)
            again[o.case.requirement] = pool.run([case])[0]
    return again


class _Progress:
    """A line per mutant once none of its cases is left (run, or in first-catch mode skipped), naming what caught
    it; called with each outcome, and ``wanted`` filters the cases (first-catch mode)."""

    def __init__(self, say: Callable[..., None], cases: list[Case], clean: dict[str, str],
                 tracker: _FirstCatch | None) -> None:
        self._say, self._clean, self._tracker = say, clean, tracker
        self._left: dict[str, int] = {}
        for case in cases:
            self._left[case.mutant] = self._left.get(case.mutant, 0) + 1
        self._hits: dict[str, list[str]] = {m: [] for m in self._left}
        self._done = 0
        self.wanted = self._wanted if tracker else None

    def __call__(self, o: CaseOutcome) -> None:
        if self._tracker is not None:
            self._tracker.record(o)
        if _catches(o.outcome, self._clean[o.case.requirement]):
            self._hits[o.case.mutant].append(o.case.requirement)
        self._one_less(o.case.mutant)

    def _wanted(self, case: Case) -> bool:
        if self._tracker is None or self._tracker.wanted(case):
            return True
        self._one_less(case.mutant)
        return False

    def _one_less(self, mutant: str) -> None:
        self._left[mutant] -= 1
        if not self._left[mutant]:
            self._done += 1
            caught = ", ".join(self._hits[mutant]) or "NOTHING"
            self._say(f"[{self._done:>2}/{len(self._left)}] {mutant:<32} caught by {caught}")
