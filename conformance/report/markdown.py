"""Render a report dict as Markdown: environment, summary, a requirement x world-size matrix, findings."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conformance.outcomes import Outcome

SYMBOLS: dict[Outcome, str] = {
    Outcome.PASS: "✅ pass",
    Outcome.FAIL: "❌ fail",
    Outcome.ERROR: "⚠️ error",
    Outcome.SKIP: "⏭ skip",
    Outcome.NOT_OBSERVABLE: "👁 n/o",
    Outcome.WAIVED: "🛈 waived",
}
VERDICT_SYMBOLS: dict[str, str] = {
    "conformant": "✅",
    "conformant-with-waivers": "🛈",
    "non-conformant": "❌",
    "incomplete": "⏸",
}


def _cell(text: Any) -> str:
    """Make ``text`` safe inside one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _environment(report: dict[str, Any]) -> list[str]:
    env = report["environment"]
    rows = [[k, "—" if v is None else f"`{v}`"] for k, v in env.items()]
    rows += [["started", report["started"]], ["finished", report["finished"]]]
    if "generation" in report:
        gen = report["generation"]
        rows.append(["generated cases", f"seed {gen['seed']}, budget {gen['budget']} (`--seed {gen['seed']} "
                                        f"--budget {gen['budget']}` reproduces them)"])
    return ["## Environment", "", *_table(["item", "value"], rows), ""]


def _summary(report: dict[str, Any]) -> list[str]:
    summary = report["summary"]
    counts = ", ".join(f"{SYMBOLS[Outcome(o)]} {n}" for o, n in summary["by_outcome"].items() if n)
    line = f"**{summary['total']} results:** {counts or 'none'}"
    if report["interrupted"]:
        line += " — **the run was interrupted; results are partial**"
    must = summary["by_level"].get("MUST")
    lines = ["## Summary", "", line]
    judged = summary.get("judged")
    if judged:
        lines += ["", f"**Judged {judged['judged']} of {judged['backend_musts']} backend MUST requirements.**"]
    if must and (must[Outcome.SKIP.value] or must[Outcome.NOT_OBSERVABLE.value]):
        shown = f"{must[Outcome.SKIP.value]} skipped, {must[Outcome.NOT_OBSERVABLE.value]} not observable"
        lines += ["", f"MUST results without a verdict: {shown}."]
    return [*lines, ""]


def _unjudged(report: dict[str, Any]) -> list[str]:
    """The MUSTs this run left without a verdict, with the capability each lacked (first thing a reader sees)."""
    judged = report["summary"].get("judged")
    if not judged or not judged["unjudged"]:
        return []
    lines = ["## MUST requirements not judged", "",
             f"This run judged {judged['judged']} of {judged['backend_musts']} backend MUST requirements; "
             "these reached no verdict:", ""]
    rows = [[f"`{u['requirement']}`", ", ".join(u["missing"]) or "—", ", ".join(u["outcomes"]), u["reason"]]
            for u in judged["unjudged"]]
    return [*lines, *_table(["Requirement", "Missing capability", "Outcome", "Reason"], rows), ""]


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


def _indent(text: str) -> list[str]:
    return ["  ```", *(f"  {line}" for line in text.splitlines()), "  ```"]


def _rank_lines(rank: dict[str, Any]) -> list[str]:
    """The rank's stack or traceback (the detail line above already names it and what it saw)."""
    trace = (rank.get("traceback") or "").strip()
    if not trace:
        return []
    status = rank.get("status") or rank.get("outcome", "")
    return [f"  - rank {rank.get('rank')} ({status}), last frames:", *_indent("\n".join(trace.splitlines()[-12:]))]


def _findings(report: dict[str, Any]) -> list[str]:
    lines = ["## Failures and findings", ""]
    failures = [r for r in report["results"] if Outcome(r["outcome"]).failing]
    for r in failures:
        lines.append(f"- {SYMBOLS[Outcome(r['outcome'])]} `{r['requirement']}` ({r['level']}, {r['area']}) "
                     f"at world size {r['world_size']}:")
        lines += _indent(r["detail"] or "(no detail)")
        for rank in r.get("ranks", []):
            lines += _rank_lines(rank)
    if not failures:
        lines.append("No failures or errors.")
    lines += ["", "### Waivers", ""]
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
    noted = [r for r in report["results"] if r.get("notes")]
    if noted:
        lines += ["", "### Notes", ""]
        for r in noted:
            where = f"`{r['requirement']}` at world size {r['world_size']}"
            lines += [f"- {where}: {note}" for note in r["notes"]]
    return [*lines, ""]


def render_markdown(report: dict[str, Any], statements: dict[str, str] | None = None) -> str:
    """The Markdown page for ``report``; ``statements`` maps requirement ids to short statements."""
    verdict = report["verdict"]
    title = f"# Conformance report: {report['target']} — {VERDICT_SYMBOLS.get(verdict, '')} {verdict}"
    lines = [
        title,
        "",
        *_unjudged(report),
        *_environment(report),
        *_summary(report),
        *_matrix(report, statements or {}),
        *_findings(report),
        f"Report schema `{report['schema']}`, digest `{report['digest']}`.",
        "",
    ]
    return "\n".join(lines)
