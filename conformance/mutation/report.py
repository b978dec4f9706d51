"""``reports/mutation.{json,md}``: the score per target and every surviving mutant with its triage.

The triage (``conformance/mutation/triage.toml``) says of a surviving mutant whether it is ``equivalent`` (no
behaviour a backend's user can observe changes; the reason says why) or a ``gap`` (a real bug no check
catches; the entry says which check would). The score counts only non-equivalent mutants:
caught / (judged - equivalent). A survivor without a triage entry is listed as untriaged and counted as a gap.
An entry names the source line it was written for (``line``, the mutated line before the mutation, stripped):
a mutant id is a position, so once the code above it moves the same id names another mutation, and an entry
whose line is not the one the survivor's diff changes is stale. An entry also names the line the mutation
makes (``mutated``, stripped); a survivor with no entry of its own takes the entry whose path, operator,
``line`` and ``mutated`` are its own (the same change, moved: the report says which id it was carried from, for
a reader to check), unless that line's text is on several lines of the file. Any other survivor counts as
untriaged.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from conformance.mutation.harness import CAUGHT, CRASHED, INCOMPETENT, KILLED, SURVIVED, TIMEOUT

TRIAGE = Path(__file__).with_name("triage.toml")
CLASSES = ("equivalent", "gap")


def load_triage(path: Path = TRIAGE) -> dict[str, dict[str, str]]:
    """Mutant id -> {"id": ..., "class": equivalent | gap, "why": ..., "line": ..., "mutated": ...}."""
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("mutant", [])
    bad = [e.get("id") for e in entries if e.get("class") not in CLASSES or not e.get("why") or not e.get("line")]
    if bad:
        raise ValueError(f"{path}: entries need class in {CLASSES}, a why and the line they were written for: {bad}")
    return {e["id"]: e for e in entries}


def mutated_line(diff: str) -> str:
    """The first non-blank source line a mutant's diff removes, stripped (what a triage entry's ``line`` names):
    a mutant that removes a decorator removes the blank line above it first."""
    return next((ln[1:].strip() for ln in diff.splitlines()
                 if ln.startswith("-") and not ln.startswith("---") and ln[1:].strip()), "")


def made_line(diff: str) -> str:
    """The first non-blank source line a mutant's diff adds, stripped (a triage entry's ``mutated``; empty when
    the mutant only removes lines)."""
    return next((ln[1:].strip() for ln in diff.splitlines()
                 if ln.startswith("+") and not ln.startswith("+++") and ln[1:].strip()), "")


def change_key(mid: str, line: str, mutated: str) -> tuple[str, ...]:
    """What a mutant changes, wherever it is: its path and operator (from its id, ``path:line:col:operator#k``),
    the line it mutates and the line it makes."""
    parts = mid.split(":")
    return (mid, line, mutated) if len(parts) != 4 else (parts[0], parts[3].split("#")[0], line, mutated)


def triage_of(row: dict[str, Any], triage: dict[str, dict[str, str]]) -> dict[str, str] | None:
    """The row's triage entry, unless it was written for another change (stale: the code moved); else the entry
    written for the same change under another id (the code moved: ``carried_from`` names that id), unless the
    mutated line's text is on more than one line of its file (``line_repeats``, set by the command: a
    ``return False`` entry would otherwise carry to every ``return False`` of the file)."""
    mid = row["mutant"]["id"]
    line, mutated = mutated_line(row.get("diff", "")), made_line(row.get("diff", ""))
    entry = triage.get(mid)
    if entry is not None and entry.get("line", line) == line and entry.get("mutated", mutated) == mutated:
        return entry
    if row.get("line_repeats", 1) != 1:  # the line's text is on more lines of its file: which one was meant?
        return None
    key = change_key(mid, line, mutated)
    same = sorted((e for e in triage.values() if "line" in e and "mutated" in e
                   and change_key(e["id"], e["line"], e["mutated"]) == key), key=lambda e: e["id"])
    if not same or len({e["class"] for e in same}) > 1:  # no such entry, or entries that disagree
        return None
    return {**same[0], "carried_from": same[0]["id"]}


def summarize(rows: list[dict[str, Any]], triage: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Counts and the score over non-equivalent mutants, for one target's rows."""
    incompetent = [r for r in rows if r["status"] == INCOMPETENT]  # does not compile: not a mutant of anything
    rows = [r for r in rows if r["status"] != INCOMPETENT]
    counts = {s: sum(r["status"] == s for r in rows) for s in (KILLED, TIMEOUT, CRASHED, SURVIVED)}
    survivors = [r for r in rows if r["status"] == SURVIVED]
    equivalent = [r for r in survivors if (triage_of(r, triage) or {}).get("class") == "equivalent"]
    caught = sum(r["status"] in CAUGHT for r in rows)
    denominator = len(rows) - len(equivalent)
    return {"judged": len(rows), **counts, "incompetent": len(incompetent), "equivalent": len(equivalent),
            "gaps": len(survivors) - len(equivalent),
            "untriaged": sum(triage_of(r, triage) is None for r in survivors),
            "raw_score": round(caught / max(1, len(rows)), 4),
            "score": round(caught / max(1, denominator), 4),
            "seconds": round(sum(r["seconds"] for r in rows), 1)}


def build(per_target: dict[str, dict[str, Any]], triage: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The report: per target its run facts, summary and survivors (with triage); the combined score."""
    out: dict[str, Any] = {"targets": {}}
    all_rows: list[dict[str, Any]] = []
    for name, run in per_target.items():
        rows = run["rows"]
        all_rows += rows
        survivors = [{**r, "triage": triage_of(r, triage)} for r in rows if r["status"] == SURVIVED]
        out["targets"][name] = {k: v for k, v in run.items() if k != "rows"} | {
            "summary": summarize(rows, triage), "survivors": survivors,
            "caught": {r["mutant"]["id"]: {"status": r["status"], "caught_by": r.get("caught_by"),
                                           "judged_on": r.get("judged_on", [])}
                       for r in rows if r["status"] in CAUGHT}}
    out["combined"] = summarize(all_rows, triage)
    return out


def _line(row: dict[str, Any]) -> str:
    diff = [ln for ln in row["diff"].splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return " / ".join(f"`{d.strip()}`" for d in diff)[:240].replace("|", "\\|")


def _judged_by(t: dict[str, Any]) -> str:
    """The command and the torch that judged every mutant; where survivors were judged again on a newer torch
    (``mutate --newest-torch``) or on the simulator's other stacks (``--other-stacks``), those and how many mutants
    only they caught."""
    text = f"`{t['command']}` on torch {t['torch']}"
    caught = [c for c in t["caught"].values() if len(c.get("judged_on") or []) > 1]
    on_stacks = sum(bool((c.get("caught_by") or {}).get("stack")) for c in caught)
    if t.get("newest_torch"):
        text += f"; survivors again on torch {t['newest_torch']} ({len(caught) - on_stacks} caught only there)"
    if t.get("other_stacks"):
        on = "; ".join(f"{', '.join(stacks)} on torch {version}" for version, stacks in t["other_stacks"].items())
        text += f"; survivors again on the other stacks ({on}; {on_stacks} caught only there)"
    return text


def render(report: dict[str, Any]) -> str:
    """Markdown for ``reports/mutation.md``."""
    c = report["combined"]
    lines = ["# Mutation testing", "",
             f"Score over non-equivalent mutants: **{c['score']:.1%}** ({c['judged'] - c['survived']} caught of "
             f"{c['judged'] - c['equivalent']} non-equivalent; {c['judged']} judged, {c['equivalent']} equivalent, "
             f"{c['gaps']} gaps). Generated by `python -m conformance mutate` (see README, Mutation testing).", "",
             "| target | judged by | mutants (all) | judged, seed | killed | timeout | crashed | survived | equivalent "
             "| gaps | score (non-equivalent) | raw score | not compiling | minutes (all runs) "
             "| mutants / min (sample run) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, t in report["targets"].items():
        s = t["summary"]
        first = (t.get("runs") or [{"judged": s["judged"], "wall_seconds": t["wall_seconds"]}])[0]
        rate = first["judged"] / max(1e-9, first["wall_seconds"] / 60)
        lines.append(f"| {name} | {_judged_by(t)} | {t['population']} | {s['judged']}, {t['seed']} | {s['killed']} "
                     f"| {s['timeout']} | {s['crashed']} | {s['survived']} | {s['equivalent']} | {s['gaps']} "
                     f"| {s['score']:.1%} | {s['raw_score']:.1%} | {s['incompetent']} | {t['wall_seconds'] / 60:.1f} "
                     f"| {rate:.1f} |")
    lines += ["", "Killed: the verdict is non-conformant (a backend MUST failed or errored; a SHOULD finding does not "
              "count). Timeout: the judge outlived the per-mutant timeout and was killed. Crashed: the judge "
              "crashed (the command would too). Each mutant counts with its latest judgement: a survivor judged "
              "again after the suite changed (`mutate --mutant ID`) replaces its earlier row; `runs` in "
              "mutation.json lists every run.", ""]
    for name, t in report["targets"].items():
        lines += [f"## Surviving mutants of {name} (torch {t['torch']}, sources {t['digest']})", "",
                  "| mutant | change | triage | why |", "| --- | --- | --- | --- |"]
        for r in t["survivors"]:
            tri = r["triage"] or {"class": "**untriaged**", "why": ""}
            carried = f" (carried from `{tri['carried_from']}`)" if tri.get("carried_from") else ""
            lines.append(f"| `{r['mutant']['id']}` | {_line(r)} | {tri['class']}{carried} | {tri['why']} |")
        lines.append("")
    return "\n".join(lines) + "\n"
