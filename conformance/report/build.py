"""Build a report dict from results: summary, verdict, timestamps, and a tamper digest."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from conformance.outcomes import Outcome
from conformance.report.model import Result
from conformance.spec import load_catalog
from conformance.targets.base import CAPABILITIES
from conformance.verdict import Verdict

SCHEMA_ID = "conformance-report/1"
SCHEMA_PATH = Path(__file__).with_name("schema.json")


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema of a report."""
    return json.loads(SCHEMA_PATH.read_text())


def validate_report(report: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``report`` does not follow the schema."""
    jsonschema.Draft202012Validator(schema()).validate(report)


def now_iso() -> str:
    """The current UTC time as an ISO 8601 string."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _is_must(result: Result) -> bool:
    return result.level.upper() == "MUST"


def _spec() -> dict[str, Any]:
    """Requirement id -> its Requirement in the shipped catalog."""
    return {r.id: r for r in load_catalog()}


def _is_backend(result: Result, spec: dict[str, Any]) -> bool:
    """Whether the requirement judges the backend (front-end ones are judged per torch version)."""
    req = spec.get(result.requirement)
    return req is None or req.kind == "backend"


def _was_judged(result: Result) -> bool:
    """A verdict on the backend was reached: pass, fail, error, or a waived fail/error."""
    if result.outcome is Outcome.WAIVED:
        return Outcome((result.waiver or {}).get("observed", Outcome.PASS)).failing
    return result.outcome is Outcome.PASS or result.outcome.failing


# Capabilities that name a torch integration path rather than something a backend does: a requirement that
# needs one cannot apply to a target without it (a vendor's backend is never torch's torchcomms path).
PATH_CAPABILITIES = frozenset({"torchcomms"})
# Why a backend MUST requirement that applies reached no verdict (``unjudged[].why``).
NOT_DECLARED, NOT_OBSERVABLE, NOT_RUN = "capability", Outcome.NOT_OBSERVABLE.value, "not-run"
_CAPABILITY_WORD = re.compile(r"[a-z_]+(?::[a-z_]+)?")


def _named_missing(detail: str, caps: set[str] | None) -> list[str]:
    """Capabilities a skip's detail names that the target lacks ("lacks capability split", "needs capability
    device_binding"): such a skip is a capability not declared, not a requirement that cannot apply."""
    if caps is None or "capabilit" not in detail:
        return []
    return sorted({w for w in _CAPABILITY_WORD.findall(detail.split("capabilit", 1)[1])
                   if w in CAPABILITIES and w not in caps})


def _inapplicable(result: Result, caps: set[str] | None) -> bool:
    """A skip saying the requirement cannot apply here, as opposed to a capability not declared or a world
    size not run: the target's not_applicable entry ("requirement does not apply on target ..."), the torch
    range ("requirement applies to torch ..."), or a check that ran and found none of what the requirement
    is about (P2P-LAZY-PAIR-COMM on a backend making no pair communicators: "the requirement applies to
    backends that make them")."""
    if result.outcome is not Outcome.SKIP or _named_missing(result.detail, caps):
        return False
    return "requirement applies to" in result.detail or "requirement does not apply" in result.detail


def judged_musts(results: list[Result], capabilities: Iterable[str] | None = None) -> dict[str, Any]:
    """Which backend MUST requirements of the run were judged; the others, and why.

    A requirement that cannot apply to the target (``_inapplicable`` at every world size, or one needing a
    path capability such as torchcomms that the target lacks) leaves the denominator and is listed in
    ``not_applicable`` with its reason. Each other unjudged one says ``why``: a ``capability`` not declared
    (``missing`` names it), ``not-observable``, or ``not-run`` (no world size of this run applies).
    ``capabilities`` (the target's) names the missing capabilities; without it they are not named.
    """
    spec = _spec()
    caps = None if capabilities is None else set(capabilities)
    by_req: dict[str, list[Result]] = {}
    for r in results:
        if _is_must(r) and _is_backend(r, spec):
            by_req.setdefault(r.requirement, []).append(r)
    judged = sorted(rid for rid, rs in by_req.items() if any(_was_judged(r) for r in rs))
    unjudged, not_applicable = [], []
    for rid, rs in by_req.items():
        if rid in judged:
            continue
        req = spec.get(rid)
        missing = [c for c in (req.capabilities if req else ()) if caps is not None and c not in caps]
        missing += sorted({c for r in rs for c in _named_missing(r.detail, caps)} - set(missing))
        undeclared = [c for c in missing if not c.startswith("observe:")]
        path = sorted(set(missing) & PATH_CAPABILITIES)
        if path or (not undeclared and all(_inapplicable(r, caps) for r in rs)):
            reason = (f"needs {', '.join(path)}: {CAPABILITIES[path[0]]}, which this target is not" if path
                      else next((r.detail for r in rs if r.detail), ""))
            not_applicable.append({"requirement": rid, "reason": reason})
            continue
        outcomes = sorted({r.outcome.value for r in rs})
        why = NOT_DECLARED if undeclared else NOT_OBSERVABLE if Outcome.NOT_OBSERVABLE.value in outcomes else NOT_RUN
        shown = next((r for r in rs if not r.detail.startswith("requirement runs at world sizes")), rs[0])
        unjudged.append({"requirement": rid, "missing": missing, "why": why, "outcomes": outcomes,
                         "reason": shown.detail})
    return {"backend_musts": len(by_req) - len(not_applicable), "judged": len(judged),
            "judged_requirements": judged, "unjudged": unjudged, "not_applicable": not_applicable}


def compute_verdict(results: Iterable[Result], interrupted: bool) -> str:
    """incomplete > non-conformant (a MUST failed/errored) > with-waivers (a MUST waived) > conformant.

    Skip and not-observable on a MUST, and any SHOULD outcome, never change the verdict; but a run
    in which no MUST was judged at all (none passed or was waived) is incomplete: it shows nothing.
    Only requirements of kind "backend" count: a front-end requirement is torch's, not the backend's.
    """
    if interrupted:
        return Verdict.INCOMPLETE
    spec = _spec()
    musts = [r.outcome for r in results if _is_must(r) and _is_backend(r, spec)]
    if any(o.failing for o in musts):
        return Verdict.NON_CONFORMANT
    if not any(o in (Outcome.PASS, Outcome.WAIVED) for o in musts):
        return Verdict.INCOMPLETE
    if Outcome.WAIVED in musts:
        return Verdict.CONFORMANT_WITH_WAIVERS
    return Verdict.CONFORMANT


def _counts(results: Iterable[Result]) -> dict[str, int]:
    counts = {o.value: 0 for o in Outcome}
    for r in results:
        counts[r.outcome.value] += 1
    return counts


def summarize(results: list[Result], capabilities: Iterable[str] | None = None) -> dict[str, Any]:
    """Counts per outcome, per area and per level, the SHOULD requirements that failed, the judged MUSTs."""
    spec = _spec()
    areas = sorted({r.area for r in results})
    levels = sorted({r.level.upper() for r in results})
    return {
        "total": len(results),
        "by_outcome": _counts(results),
        "by_area": {a: _counts(r for r in results if r.area == a) for a in areas},
        "by_level": {lv: _counts(r for r in results if r.level.upper() == lv) for lv in levels},
        "should_failures": [
            {"requirement": r.requirement, "world_size": r.world_size, "outcome": r.outcome.value,
             "kind": spec[r.requirement].kind if r.requirement in spec else "backend"}
            for r in results
            if not _is_must(r) and r.outcome.failing
        ],
        "judged": judged_musts(results, capabilities),
    }


def canonical_json(report: dict[str, Any]) -> bytes:
    """The bytes the digest covers: the report without ``digest``, sorted keys, compact."""
    body = {k: v for k, v in report.items() if k != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def compute_digest(report: dict[str, Any]) -> str:
    """sha256 hex of canonical_json(report)."""
    return hashlib.sha256(canonical_json(report)).hexdigest()


def verify_digest(report: dict[str, Any]) -> bool:
    """True when the report's ``digest`` matches its content (False if absent or tampered)."""
    try:
        return report.get("digest") == compute_digest(report)
    except (TypeError, ValueError):
        return False


def _waivers_from_results(results: list[Result]) -> list[dict[str, Any]]:
    used: list[dict[str, Any]] = []
    for r in results:
        if r.waiver is not None:
            entry = {k: v for k, v in r.waiver.items() if k != "observed"}
            if entry not in used:
                used.append(entry)
    return used


def build_report(
    target: str,
    results: list[Result],
    environment: dict[str, Any],
    *,
    interrupted: bool = False,
    waivers_used: Iterable[dict[str, Any]] = (),
    stale_waivers: Iterable[dict[str, Any]] = (),
    out_of_range_waivers: Iterable[dict[str, Any]] = (),
    started: str | None = None,
    capabilities: Iterable[str] | None = None,
    generation: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Assemble, validate and digest a ``conformance-report/1`` dict.

    ``waivers_used`` defaults to the distinct waivers found on the results; ``capabilities`` (the
    target's) lets the summary name what each unjudged MUST lacked; ``generation`` is the seed and budget
    of the generated data cases.
    """
    finished = now_iso()
    report: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "target": target,
        "verdict": compute_verdict(results, interrupted),
        "environment": dict(environment),
        "results": [r.to_json() for r in results],
        "summary": summarize(results, capabilities),
        "waivers_used": list(waivers_used) or _waivers_from_results(results),
        "stale_waivers": list(stale_waivers),
        "out_of_range_waivers": list(out_of_range_waivers),
        "started": started or finished,
        "finished": finished,
        "interrupted": interrupted,
    }
    if generation is not None:
        report["generation"] = dict(generation)
    report["digest"] = compute_digest(report)
    validate_report(report)
    return report


def with_invocation(report: dict[str, Any], invocation: dict[str, Any]) -> dict[str, Any]:
    """``report`` with how the front door made it (command line, timeout, world sizes, declared capabilities),
    validated and digested again: the session builds the report, only the CLI knows its command."""
    report = {k: v for k, v in report.items() if k != "digest"} | {"invocation": dict(invocation)}
    report["digest"] = compute_digest(report)
    validate_report(report)
    return report
