"""Build a report dict from results: summary, verdict, timestamps, and a tamper digest."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from conformance.outcomes import Outcome
from conformance.report.model import Result
from conformance.spec import load_catalog

SCHEMA_ID = "conformance-report/1"
SCHEMA_PATH = Path(__file__).with_name("schema.json")


class Verdict:
    """The certification verdicts, strongest claim first."""

    CONFORMANT = "conformant"
    CONFORMANT_WITH_WAIVERS = "conformant-with-waivers"
    NON_CONFORMANT = "non-conformant"
    INCOMPLETE = "incomplete"


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


def judged_musts(results: list[Result], capabilities: Iterable[str] | None = None) -> dict[str, Any]:
    """Which backend MUST requirements of the run were judged; the others with what they lacked.

    ``capabilities`` (the target's) names the missing capabilities of an unjudged requirement;
    without it, or when none is missing, the reason is the outcome's detail.
    """
    spec = _spec()
    caps = None if capabilities is None else set(capabilities)
    by_req: dict[str, list[Result]] = {}
    for r in results:
        if _is_must(r) and _is_backend(r, spec):
            by_req.setdefault(r.requirement, []).append(r)
    judged = sorted(rid for rid, rs in by_req.items() if any(_was_judged(r) for r in rs))
    unjudged = []
    for rid, rs in by_req.items():
        if rid in judged:
            continue
        req = spec.get(rid)
        missing = [c for c in (req.capabilities if req else ()) if caps is not None and c not in caps]
        unjudged.append({"requirement": rid, "missing": missing,
                         "outcomes": sorted({r.outcome.value for r in rs}), "reason": rs[0].detail})
    return {"backend_musts": len(by_req), "judged": len(judged), "judged_requirements": judged,
            "unjudged": unjudged}


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
    areas = sorted({r.area for r in results})
    levels = sorted({r.level.upper() for r in results})
    return {
        "total": len(results),
        "by_outcome": _counts(results),
        "by_area": {a: _counts(r for r in results if r.area == a) for a in areas},
        "by_level": {lv: _counts(r for r in results if r.level.upper() == lv) for lv in levels},
        "should_failures": [
            {"requirement": r.requirement, "world_size": r.world_size, "outcome": r.outcome.value}
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
