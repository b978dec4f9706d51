"""Render a report dict as Markdown, a document to hand over: the summary first (verdict, what was judged and
why the rest was not, the command and the declared capabilities), then each failure once with the ranks that
saw it and a command reproducing it, findings on torch's front end and SHOULD findings apart, what was not
judged, the matrix, waivers and notes, and the environment."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

from conformance.outcomes import Outcome
from conformance.report.build import NOT_DECLARED, NOT_OBSERVABLE, NOT_RUN
from conformance.report.details import rank_span
from conformance.spec import load_catalog
from conformance.verdict import Verdict

SYMBOLS: dict[Outcome, str] = {
    Outcome.PASS: "✅ pass",
    Outcome.FAIL: "❌ fail",
    Outcome.ERROR: "⚠️ error",
    Outcome.SKIP: "⏭ skip",
    Outcome.NOT_OBSERVABLE: "👁 n/o",
    Outcome.WAIVED: "🛈 waived",
}
WHY: dict[str, str] = {
    NOT_DECLARED: "capability lacking (not declared)",
    NOT_OBSERVABLE: "not observable",
    NOT_RUN: "not run (world size, or a limit of the target)",
}
# Options whose value the reproduction command replaces (flag -> takes a value).
_REPLACED = {"--requirement": True, "--area": True, "--world-sizes": True, "--report-dir": True}
TRACE_LINES = 12


def _cell(text: Any) -> str:
    """Make ``text`` safe inside one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _ids(ids: Iterable[str]) -> str:
    return ", ".join(f"`{i}`" for i in ids)


def _kinds() -> dict[str, str]:
    """Requirement id -> kind ("backend" or "frontend") in the shipped catalog."""
    return {r.id: r.kind for r in load_catalog()}


def _is_frontend(result: dict[str, Any], kinds: dict[str, str]) -> bool:
    return kinds.get(result["requirement"], "backend") == "frontend"


def reproduce(report: dict[str, Any], requirement: str, world_size: int) -> str:
    """The command that runs one requirement at one world size as this report's run did."""
    argv = (report.get("invocation") or {}).get("argv")
    if not argv:
        argv = ["run", "--target", report["target"]]
    kept: list[str] = []
    skip_next = False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in _REPLACED:
            skip_next = "=" not in arg
            continue
        kept.append(arg)
    kept += ["--requirement", requirement, "--world-sizes", str(world_size), "--report-dir", "repro"]
    return shlex.join(["python", "-m", "conformance", *kept])


def _summary(report: dict[str, Any], kinds: dict[str, str]) -> list[str]:
    summary, env = report["summary"], report["environment"]
    verdict = report["verdict"]
    lines = ["## Summary", "", f"**Verdict: {verdict}**: {Verdict(verdict).meaning}."]
    if report["interrupted"]:
        lines[-1] += " **The run was interrupted; results are partial.**"
    lines.append("")
    what = f"- Target `{report['target']}`"
    if env.get("backend"):
        package = f", package `{env.get('package')}` {env.get('version') or ''}".rstrip() if env.get("package") else ""
        device = f", device `{env['device']}`" if env.get("device") else ""
        what += f" (backend `{env['backend']}`{package}{device})"
    lines.append(what + f" on torch `{env['torch']}`.")
    invocation = report.get("invocation")
    if invocation:
        lines.append(f"- Command: `{invocation['command']}`")
        if "declared_capabilities" in invocation:
            caps = invocation["declared_capabilities"]
            factory = invocation.get("options_factory")
            lines.append(f"- Declared capabilities: {_ids(caps) if caps else 'none'}"
                         + (f"; options factory `{factory}`" if factory else "") + ".")
    judged = summary.get("judged")
    if judged:
        lines.append(f"- **Judged {judged['judged']} of {judged['backend_musts']} backend MUST requirements** "
                     "that apply to this target.")
        failing = sorted({r["requirement"] for r in report["results"] if r["level"].upper() == "MUST"
                          and Outcome(r["outcome"]).failing and not _is_frontend(r, kinds)})
        if failing:
            lines.append(f"  - failed or errored: {_ids(failing)} (see Failures)")
        for why, label in WHY.items():
            ids = [u["requirement"] for u in judged["unjudged"] if u.get("why") == why]
            if ids:
                lines.append(f"  - not judged, {label}: {_ids(ids)}")
        if judged.get("not_applicable"):
            ids = [n["requirement"] for n in judged["not_applicable"]]
            lines.append(f"  - cannot apply to this target, left out of the count: {_ids(ids)}")
    should = summary.get("should_failures", [])
    if should:
        front = sorted({s["requirement"] for s in should if s.get("kind") == "frontend"})
        back = sorted({s["requirement"] for s in should if s.get("kind") != "frontend"})
        text = f"- SHOULD findings (never change the verdict): {len(should)} result(s)"
        parts = ([f"owned by torch's front end (kind = frontend, judged per torch version): {_ids(front)}"]
                 if front else []) + ([f"the backend's: {_ids(back)}"] if back else [])
        lines.append(text + "; " + "; ".join(parts) + ".")
    front_must = sorted({r["requirement"] for r in report["results"] if r["level"].upper() == "MUST"
                         and Outcome(r["outcome"]).failing and _is_frontend(r, kinds)})
    if front_must:
        lines.append(f"- Front-end MUST findings (torch `{env['torch']}`'s own behaviour, not counted in the "
                     f"verdict): {_ids(front_must)}.")
    counts = ", ".join(f"{SYMBOLS[Outcome(o)]} {n}" for o, n in summary["by_outcome"].items() if n)
    lines.append(f"- {summary['total']} results: {counts or 'none'}.")
    return [*lines, ""]


def _traces(ranks: list[dict[str, Any]]) -> list[str]:
    """Each distinct rank traceback once (its last frames), with the ranks that had it."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rank in ranks:
        trace = (rank.get("traceback") or "").strip()
        if trace:
            groups.setdefault("\n".join(trace.splitlines()[-TRACE_LINES:]), []).append(rank)
    lines = []
    for trace, who in groups.items():
        statuses = sorted({r.get("status") or r.get("outcome", "") for r in who})
        lines += [f"  - {rank_span(r['rank'] for r in who)} ({', '.join(statuses)}), last frames:", *_indent(trace)]
    return lines


def _indent(text: str) -> list[str]:
    return ["  ```", *(f"  {line}" for line in text.splitlines()), "  ```"]


def _failure(report: dict[str, Any], r: dict[str, Any]) -> list[str]:
    lines = [f"### `{r['requirement']}` ({r['level']}, {r['area']}) at world size {r['world_size']}: "
             f"{SYMBOLS[Outcome(r['outcome'])]}", ""]
    lines += _indent(r["detail"] or "(no detail)")
    lines += ["", f"  Reproduce: `{reproduce(report, r['requirement'], r['world_size'])}`", ""]
    traces = _traces(r.get("ranks", []))
    return [*lines, *traces, *([""] if traces else [])]


def _failures(report: dict[str, Any], kinds: dict[str, str]) -> list[str]:
    failing = [r for r in report["results"] if Outcome(r["outcome"]).failing]
    backend = [r for r in failing if r["level"].upper() == "MUST" and not _is_frontend(r, kinds)]
    lines = ["## Failures", ""]
    lines += [line for r in backend for line in _failure(report, r)] or ["No backend MUST failures or errors.", ""]
    front = [r for r in failing if _is_frontend(r, kinds)]
    should = [r for r in failing if r["level"].upper() != "MUST" and not _is_frontend(r, kinds)]
    if front:
        lines += ["## Findings on torch's front end", "",
                  f"Requirements of kind `frontend` are decided by torch `{report['environment']['torch']}` before "
                  "the backend runs: they describe this torch, not the backend, and no verdict counts them.", ""]
        lines += [line for r in front for line in _failure(report, r)]
    if should:
        lines += ["## SHOULD findings", "", "SHOULD requirements never change the verdict.", ""]
        lines += [line for r in should for line in _failure(report, r)]
    return lines


def _not_judged(report: dict[str, Any]) -> list[str]:
    judged = report["summary"].get("judged")
    if not judged or not (judged["unjudged"] or judged.get("not_applicable")):
        return []
    lines = ["## Not judged", ""]
    if judged["unjudged"]:
        rows = [[f"`{u['requirement']}`", WHY.get(u.get("why", ""), "—"), ", ".join(u["missing"]) or "—",
                 u["reason"]] for u in judged["unjudged"]]
        lines += ["Backend MUST requirements that apply to this target but reached no verdict:", "",
                  *_table(["Requirement", "Why", "Missing capability", "Reason"], rows), ""]
    if judged.get("not_applicable"):
        rows = [[f"`{n['requirement']}`", n["reason"]] for n in judged["not_applicable"]]
        lines += ["Backend MUST requirements that cannot apply to this target (not counted):", "",
                  *_table(["Requirement", "Reason"], rows), ""]
    return lines


def _matrix(report: dict[str, Any], statements: dict[str, str]) -> list[str]:
    results = report["results"]
    sizes = sorted({r["world_size"] for r in results})
    lines = ["## Matrix", ""]
    for area in sorted({r["area"] for r in results}):
        cells: dict[str, dict[int, str]] = {}
        levels: dict[str, str] = {}
        for r in results:
            if r["area"] == area:
                symbol = SYMBOLS[Outcome(r["outcome"])]
                cells.setdefault(r["requirement"], {})[r["world_size"]] = symbol
                levels[r["requirement"]] = r["level"]
        header = ["Requirement", "Level", "Statement", *(f"ws={n}" for n in sizes)]
        rows = [
            [f"`{rid}`", levels[rid], statements.get(rid, ""), *(cells[rid].get(n, "—") for n in sizes)]
            for rid in cells
        ]
        lines += [f"### {area}", "", *_table(header, rows), ""]
    return lines


def _waivers_and_notes(report: dict[str, Any]) -> list[str]:
    lines = ["## Waivers", ""]
    waived = [r for r in report["results"] if r.get("waiver")]
    for r in waived:
        w = r["waiver"]
        lines.append(f"- 🛈 `{r['requirement']}` at world size {r['world_size']}: observed {w['observed']}, "
                     f"waived — {w['reason']} ({w['issue']})")
        lines += _indent(r["detail"]) if r["detail"] else []
    if not waived:
        lines.append("No waivers applied.")
    lines += ["", "### Stale waivers", ""]
    lines += [f"- {s['message']}" for s in report["stale_waivers"]] or ["None."]
    if report.get("out_of_range_waivers"):
        lines += ["", "### Waivers out of this torch's range (not applied)", ""]
        lines += [f"- {w['message']}" for w in report["out_of_range_waivers"]]
    notes: dict[str, list[str]] = {}
    for r in report["results"]:
        for note in r.get("notes", []):
            notes.setdefault(note, []).append(f"`{r['requirement']}` ws={r['world_size']}")
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"- {note} ({', '.join(where)})" for note, where in notes.items()]
    return [*lines, ""]


def _environment(report: dict[str, Any]) -> list[str]:
    env = report["environment"]
    rows = [[k, "—" if v is None else f"`{v}`"] for k, v in env.items()]
    invocation = report.get("invocation")
    if invocation:
        rows += [["per-check timeout", f"{invocation['timeout_s']:g} s"],
                 ["world sizes", ", ".join(map(str, invocation["world_sizes"]))]]
    rows += [["started", report["started"]], ["finished", report["finished"]]]
    if "generation" in report:
        gen = report["generation"]
        rows.append(["generated cases", f"seed {gen['seed']}, budget {gen['budget']} (`--seed {gen['seed']} "
                                        f"--budget {gen['budget']}` reproduces them)"])
    return ["## Environment", "", *_table(["item", "value"], rows), ""]


def render_markdown(report: dict[str, Any], statements: dict[str, str] | None = None) -> str:
    """The Markdown page for ``report``; ``statements`` maps requirement ids to short statements."""
    verdict = report["verdict"]
    kind = "Certification" if "declared_capabilities" in (report.get("invocation") or {}) else "Conformance"
    title = f"# {kind} report: {report['target']} — {Verdict(verdict).symbol} {verdict}"
    kinds = _kinds()
    lines = [
        title,
        "",
        *_summary(report, kinds),
        *_failures(report, kinds),
        *_not_judged(report),
        *_matrix(report, statements or {}),
        *_waivers_and_notes(report),
        *_environment(report),
        f"Report schema `{report['schema']}`, digest `{report['digest']}`.",
        "",
    ]
    return "\n".join(lines)
