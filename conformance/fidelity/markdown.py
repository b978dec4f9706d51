"""The fidelity report as Markdown."""

from __future__ import annotations

from typing import Any

from conformance.fidelity.job import leaks, passed

_COUNTED = ("match", "sim-fail", "gloo-only", "gloo-skip", "gloo-fail", "absent")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300] or "-"


def render(report: dict[str, Any], command: str) -> str:
    """The Markdown text of a fidelity report."""
    out = [f"# Fidelity: torch's own distributed tests, gloo and the simulator (torch {report['torch']})", "",
           f"`{command}`, {report['date']}; ranks started by {report['start_method']}"
           + (f"; gloo's outcomes from this job's earlier run on the same torch ({report['gloo_from']})"
              if report.get("gloo_from") else "") + ". "
           f"{report['selected']} tests of `DistributedTest._DistTestBase` "
           "(`conformance/fidelity/selection.toml`); the simulator runs exactly those gloo does not skip, "
           "under the decorators torch applies for gloo.", "",
           f"**Result: {'every gloo pass passes on the simulator' if passed(report) else 'NOT as gloo'}** "
           "(gloo-only tests aside; no segment left in /dev/shm).", "",
           "| world size | gloo pass | gloo skip | gloo fail | sim pass (of gloo's passes) | sim fail | gloo-only | "
           "absent | segments left | leak probe sees a segment |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for size in report["world_sizes"]:
        count = {k: sum(r["verdict"] == k for r in size["rows"]) for k in _COUNTED}
        gloo_pass = count["match"] + count["sim-fail"] + count["gloo-only"]
        left = sum(1 for n, _, _ in leaks(report) if n == size["world_size"])
        out.append(f"| {size['world_size']} | {gloo_pass} | {count['gloo-skip']} | {count['gloo-fail']} | "
                   f"{count['match']} | {count['sim-fail']} | {count['gloo-only']} | {count['absent']} | {left} | "
                   f"{'yes' if size['leak_probe_sees_segments'] else 'NO'} |")
    out += ["", "## Gloo passes, the simulator fails", ""]
    fails = [(s["world_size"], r) for s in report["world_sizes"] for r in s["rows"] if r["verdict"] == "sim-fail"]
    if fails:
        out += ["| test | world size | simulator says |", "| --- | --- | --- |"]
        out += [f"| `{r['test']}` | {n} | {_cell(r['sim']['message'] if r['sim'] else 'not run')} |" for n, r in fails]
    else:
        out.append("None.")
    out += ["", "## Gloo-only (listed in the selection file, with the reason)", ""]
    for name, group in report["gloo_only"].items():
        sim_seen = [f"`{r['test']}` (ws {s['world_size']}): "
                    + (f"{r['sim']['outcome']} ({_cell(r['sim']['message'])})" if r["sim"] else "not run")
                    for s in report["world_sizes"] for r in s["rows"]
                    if r["verdict"] == "gloo-only" and r["test"] in group["tests"]]
        out += [f"- **{name}**: {', '.join(f'`{t}`' for t in group['tests'])}.", f"  Reason: {group['reason']}",
                f"  Source: {'; '.join(group['source'])}.", f"  Simulator outcomes: {'; '.join(sim_seen) or '-'}."]
    out += ["", "## Segments left in /dev/shm after every rank exited", ""]
    out += [f"- ws {n}, `{t}`: {', '.join(segs)}" for n, t, segs in leaks(report)] or ["None."]
    out += ["", "## Gloo's own failures (not counted against the simulator)", ""]
    gfails = [(s["world_size"], r) for s in report["world_sizes"] for r in s["rows"] if r["verdict"] == "gloo-fail"]
    out += [f"- `{r['test']}` (ws {n}): {_cell(r['gloo']['message'])}; simulator: "
            f"{r['sim']['outcome'] if r['sim'] else 'not run'}" for n, r in gfails] or ["None."]
    out += ["", "## Skipped for gloo (so not run on the simulator), with torch's reason", "",
            "| test | world sizes | reason |", "| --- | --- | --- |"]
    skips: dict[tuple[str, str], list[str]] = {}
    for s in report["world_sizes"]:
        for r in s["rows"]:
            if r["verdict"] in ("gloo-skip", "absent"):
                skips.setdefault((r["test"], r["gloo"]["message"]), []).append(str(s["world_size"]))
    out += [f"| `{t}` | {', '.join(ns)} | {_cell(m)} |" for (t, m), ns in skips.items()]
    return "\n".join(out) + "\n"
