"""``python -m conformance mutate``: sample mutants, judge them, append to the results, rewrite the report."""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from conformance import inputs, interrupts

if TYPE_CHECKING:
    from conformance.mutation.harness import Mutant
    from conformance.mutation.targets import MutationTarget

ROOT = Path(__file__).resolve().parents[2]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommand's options."""
    p.add_argument("--target", default="simulator,toyccl", help="simulator, toyccl, or both (comma-separated)")
    p.add_argument("--sample", type=int, default=None, help="judge a seeded sample of N mutants per target")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--mutant", action="append", default=[], metavar="ID",
                   help="judge this mutant (path:line:col:operator, as in the report), again if recorded")
    p.add_argument("--jobs", type=int, default=2, help="mutants judged at once (each a copy of the tree)")
    p.add_argument("--mutant-timeout", type=float, default=150.0,
                   help="seconds a judge may run; one that runs longer is killed and counts as caught by timeout")
    # 15 s: toyccl's generated coalesced blocks take about 9 s at world 2 on a quiet 2-core host, and a clean
    # check past its timeout would count its mutant as caught
    p.add_argument("--timeout", type=inputs.timeout, default=15.0, help="per-check timeout inside the judge")
    p.add_argument("--world-sizes", type=inputs.world_sizes, default=[2, 4])
    p.add_argument("--requirement", default="",
                   help="judge with only these requirements (comma-separated): which of them kill a mutant")
    p.add_argument("--results-dir", type=Path, default=Path("reports/mutation"),
                   help="<target>.jsonl (one line per judged mutant) and <target>.meta.json; reused when the "
                        "sources are unchanged, so a sample can grow run by run")
    p.add_argument("--report-dir", type=Path, default=Path("reports"), help="where mutation.json and .md go")
    p.add_argument("--newest-torch", default="auto", metavar="PYTHON",
                   help="judge this run's survivors again on this interpreter's torch (a mutant is caught when "
                        "either torch's verdict is non-conformant); 'auto': the venv .venvs/torch-newest "
                        "(ci/torch-newest.txt) when it exists; 'off': none")
    p.add_argument("--other-stacks", default="auto", metavar="STACKS",
                   help="judge this run's survivors again on these simulator stacks (comma-separated; 'auto': "
                        "every stack the target models but this torch's default; 'off': none)")
    p.add_argument("--again-only", action="store_true",
                   help="judge the recorded survivors (of --mutant, else all) only again: on the newest torch and "
                        "the other stacks that have not judged them yet")


@dataclass(frozen=True)
class Judgement:
    """Where survivors are judged again: an interpreter (its torch) and the simulator stack, if not the default."""

    python: Path
    torch: str
    stack: str = ""

    @property
    def label(self) -> str:
        """How a result's ``judged_on`` names it."""
        return f"{self.torch} stack={self.stack}" if self.stack else self.torch

    @property
    def args(self) -> list[str]:
        """What the judge is told (``--stack``)."""
        return ["--stack", self.stack] if self.stack else []


def _other_stacks(target: MutationTarget, asked: str, default: str) -> list[str]:
    """The stacks ``--other-stacks`` names for ``target``: 'auto' is every one it models but ``default``."""
    if asked == "off" or not target.stacks:
        return []
    if asked == "auto":
        return [s for s in target.stacks if s != default]
    named = [s.strip() for s in asked.split(",") if s.strip()]
    unknown = [s for s in named if s not in target.stacks]
    if unknown:
        raise ValueError(f"--other-stacks {unknown}: target {target.name} models {', '.join(target.stacks)}")
    return [s for s in named if s != default]


def _pick(population: list[Mutant], args: argparse.Namespace, done: dict[str, Any]) -> list[Mutant]:
    from conformance.mutation.harness import sample

    by_id = {m.id: m for m in population}
    named = [by_id[i] for i in args.mutant if i in by_id]
    if not args.mutant or args.sample is not None:
        named += [m for m in sample(population, args.sample, args.seed) if m.id not in done]
    return list({m.id: m for m in named}.values())


@functools.cache
def _repeats(path: Path) -> collections.Counter[str]:
    """How many lines of ``path`` have each stripped text."""
    return collections.Counter(line.strip() for line in path.read_text().splitlines())


def _meta(path: Path, defaults: dict[str, Any]) -> dict[str, Any]:
    """The target's run facts: ``defaults`` with the wall time and the runs recorded for the same sources."""
    old = json.loads(path.read_text()) if path.exists() else {}
    same = old.get("digest") == defaults["digest"]
    sampled = defaults.pop("sampled", True)
    kept = {k: old[k] for k in ("newest_torch", "other_stacks") if same and old.get(k)}
    if same and not sampled and "seed" in old:
        kept["seed"] = old["seed"]  # a run of named mutants only keeps the sample's seed
    return defaults | kept | {"wall_seconds": old.get("wall_seconds", 0.0) if same else 0.0,
                              "runs": old.get("runs", []) if same else []}


def _recorder(rows_path: Path, digest: str, done: dict[str, Any], total: int, say: Any, on: Judgement,
              again: bool = False, first: str = "") -> Any:
    """What to do with each judged mutant: append it to the results file, record it, say it. ``again``: a
    survivor judged again (on another torch or stack, ``on``): its row lists every judgement (``first``, the one
    that judged it before, where its row does not say), and what caught it names the torch and stack that did."""
    from conformance.mutation.harness import CAUGHT, Judged

    count = [0]

    def record(j: Judged) -> None:
        count[0] += 1
        before = (done.get(j.mutant.id, {}).get("judged_on") or [first]) if again else []
        j.judged_on = [*before, on.label]
        if j.caught_by is not None:
            j.caught_by = {**j.caught_by, "torch": on.torch, **({"stack": on.stack} if on.stack else {})}
        row = j.to_json() | {"digest": digest}
        with rows_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done[j.mutant.id] = row
        by = j.caught_by or {}
        say(f"[{count[0]:>3}/{total}]{' ' + on.label if again else ''} {j.status:<8} {j.seconds:>6.1f}s "
            f"{j.mutant.id}"
            + (f"  <- {by.get('requirement', '')} ws={by.get('world_size', '')}" if j.status in CAUGHT else ""))

    record.count = count  # type: ignore[attr-defined]  # how many it recorded (a run stopped early: fewer)
    return record


def cmd_mutate(args: argparse.Namespace, say: Any = print) -> int:
    """Judge the chosen mutants of each target; exit 0 when every judged survivor is triaged equivalent."""
    import torch  # here, not at the top: building the CLI's parser must not load cosmic-ray's plugins

    from conformance.mutation import report
    from conformance.mutation.harness import (
        SURVIVED,
        Mutant,
        enumerate_mutants,
        load_results,
        newest_python,
        rule_equivalent,
        run_mutants,
        source_digest,
    )
    from conformance.mutation.harness import torch_version as version_of
    from conformance.mutation.targets import TARGETS
    from conformance.report.write import atomic_write_text
    from conformance.torch_compat import default_stack

    names = [t.strip() for t in args.target.split(",") if t.strip()]
    if not names or any(n not in TARGETS for n in names):
        raise ValueError(f"--target {args.target!r}: expected some of {sorted(TARGETS)}, comma-separated")
    stray = [i for i in args.mutant if not any(i.startswith(TARGETS[n].source + "/") for n in names)]
    if stray:
        raise ValueError(f"--mutant {stray}: not a mutant of {', '.join(names)} (ids start with the mutated file)")
    judge_args = ["--timeout", str(args.timeout), "--world-sizes", ",".join(map(str, args.world_sizes)),
                  *(["--requirement", args.requirement] if args.requirement else [])]
    args.results_dir.mkdir(parents=True, exist_ok=True)
    newest = (None if args.newest_torch == "off" else newest_python(ROOT) if args.newest_torch == "auto"
              else Path(args.newest_torch))
    newest_version = version_of(newest) if newest is not None else ""
    if newest_version == torch.__version__:
        newest = None  # the same torch: nothing more to see
    for target in (TARGETS[n] for n in names):
        digest = source_digest(ROOT, target)
        population = enumerate_mutants(ROOT, target)
        ids = {m.id for m in population}
        unknown = [i for i in args.mutant if i.startswith(target.source + "/") and i not in ids]
        if unknown:
            raise ValueError(f"no such mutant of {target.name}: {unknown}")
        rows_path = args.results_dir / f"{target.name}.jsonl"
        meta_path = args.results_dir / f"{target.name}.meta.json"
        done = load_results(rows_path, digest)
        torches = [(Path(sys.executable), torch.__version__), *([(newest, newest_version)] if newest else [])]
        later = [Judgement(python, version, stack) for python, version in torches
                 for stack in ("", *_other_stacks(target, args.other_stacks, default_stack(running=Version(version))))
                 if stack or version != torch.__version__]  # this torch's default stack judged them first
        if args.again_only:
            if not later:
                raise ValueError("--again-only: no newer torch (--newest-torch, .venvs/torch-newest) and no other "
                                 "stack (--other-stacks) to judge on")
            by_id = {m.id: m for m in population}
            todo = [by_id[i] for i, r in done.items() if i in by_id and r["status"] == SURVIVED
                    and any(j.label not in r.get("judged_on", []) for j in later)
                    and (not args.mutant or i in args.mutant)]
        else:
            todo = [m for m in _pick(population, args, done) if m.target == target.name]
        meta = _meta(meta_path, {"population": len(population), "seed": args.seed, "digest": digest,
                                 "sampled": args.sample is not None and not args.again_only,
                                 "torch": torch.__version__, "command": target.command, "jobs": args.jobs,
                                 "judge_args": judge_args, "mutant_timeout_s": args.mutant_timeout})
        say(f"{target.name}: {len(population)} mutants; judging {len(todo)} ({len(done)} recorded) "
            f"on {args.jobs} slots")
        started = time.perf_counter()
        record = None
        try:
            if todo and not args.again_only:
                record = _recorder(rows_path, digest, done, len(todo), say, Judgement(Path(sys.executable),
                                                                                      torch.__version__))
                with interrupts.raising():
                    meta["baseline_seconds"] = round(run_mutants(ROOT, todo, args.jobs, judge_args,
                                                                 args.mutant_timeout, record), 1)
            for on in later:  # a mutant some torch's code path (torch 2.15's gather_single) or one stack's reaches
                again = [m for m in todo if done[m.id]["status"] == SURVIVED
                         and on.label not in done[m.id].get("judged_on", [])]
                if not again:
                    continue
                say(f"{target.name}: judging the {len(again)} survivors again on torch {on.label}")
                if on.stack:
                    stacks = meta.setdefault("other_stacks", {})
                    stacks[on.torch] = sorted({*stacks.get(on.torch, []), on.stack})
                else:
                    meta["newest_torch"] = on.torch
                record_again = _recorder(rows_path, digest, done, len(again), say, on, again=True,
                                         first=torch.__version__)
                with interrupts.raising():
                    run_mutants(ROOT, again, args.jobs, [*judge_args, *on.args], args.mutant_timeout, record_again,
                                on.python)
        except KeyboardInterrupt:
            say(f"interrupted: {len(done)} mutants of {target.name} recorded in {rows_path}; run again to go on")
            return 3
        finally:
            took = round(time.perf_counter() - started, 1)
            meta["wall_seconds"] = round(meta["wall_seconds"] + took, 1)
            if todo:  # each invocation: how many it judged in how long (mutants per minute); one that judged
                # nothing (a report rebuilt) leaves the facts of the runs that did (seed, judge arguments)
                judged = record.count[0] if record is not None else len(todo)  # stage 1's, as recorded
                meta["runs"].append({"judged": judged, "wall_seconds": took, "jobs": args.jobs,
                                     "requirement": args.requirement, "mutants_given": len(args.mutant),
                                     "judge_args": judge_args})
                atomic_write_text(meta_path, json.dumps(meta, indent=2))
    per_target: dict[str, dict[str, Any]] = {}
    # the report covers every target with results for its current sources, less mutants of modules the target
    # no longer mutates (its planted defects: recorded before they were left out of the population)
    for name, target in TARGETS.items():
        meta_path = args.results_dir / f"{name}.meta.json"
        rows = load_results(args.results_dir / f"{name}.jsonl", source_digest(ROOT, target))
        rows = {i: r for i, r in rows.items() if Path(r["mutant"]["path"]).name not in target.planted}
        for r in rows.values():  # how often the mutated line's text is in its file now: a triage entry of another
            # id carries only to a line whose text is there once (report.triage_of)
            r["line_repeats"] = _repeats(ROOT / r["mutant"]["path"]).get(report.mutated_line(r.get("diff", "")), 0)
        if meta_path.exists() and rows:
            per_target[name] = json.loads(meta_path.read_text()) | {"rows": list(rows.values())}
    judged = [Mutant(**r["mutant"]) for run in per_target.values() for r in run["rows"]]
    built = report.build(per_target, rule_equivalent(ROOT, judged) | report.load_triage())
    args.report_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.report_dir / "mutation.json", json.dumps(built, indent=2, sort_keys=True))
    atomic_write_text(args.report_dir / "mutation.md", report.render(built))
    c = built["combined"]
    say(f"score over non-equivalent mutants {c['score']:.1%} ({c['judged']} judged, {c['survived']} survived, "
        f"{c['equivalent']} equivalent, {c['untriaged']} untriaged)")
    return 0 if c["gaps"] == 0 else 1
