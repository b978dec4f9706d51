"""Per-target expectation (waiver) files: load, validate, apply, and detect stale waivers.

A file ``conformance/expectations/<target>.toml`` holds ``[[expect]]`` tables, each naming a
requirement the target is known to fail, why, and the upstream issue. Applying them turns a
matching fail/error into ``waived`` (never ``pass``); an entry whose requirement now passes
is a stale waiver. An entry scoped to a torch range that excludes the running torch is not
applied, and is reported as out of range (a note on each result it names, and a list in the
report), never silently dropped.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from conformance.outcomes import Outcome
from conformance.report.model import Result
from conformance.report.write import safe_stem

EXPECTATIONS_DIR = Path(__file__).resolve().parent.parent / "expectations"
EXPECTED_OUTCOMES: tuple[str, ...] = (Outcome.FAIL.value, Outcome.ERROR.value, Outcome.NOT_OBSERVABLE.value)
_WAIVABLE = (Outcome.FAIL.value, Outcome.ERROR.value)
_FIELDS = ("requirement", "outcome", "reason", "issue", "world_sizes", "torch")


class ExpectationError(ValueError):
    """A malformed expectation file: names the file, the requirement and the field at fault."""

    def __init__(self, file: str, requirement: str, field: str, problem: str) -> None:
        self.file, self.requirement, self.field = file, requirement, field
        super().__init__(f"{file}: requirement {requirement!r}, field {field!r}: {problem}")


class StaleWaiverError(RuntimeError):
    """Strict mode found waivers whose requirement now passes; carries the results and the list."""

    def __init__(self, results: list[Result], stale: list[dict[str, Any]]) -> None:
        self.results, self.stale = results, stale
        super().__init__("stale waivers: " + "; ".join(s["message"] for s in stale))


@dataclass(frozen=True)
class Expectation:
    """One ``[[expect]]`` entry: a known failure of one requirement on one target."""

    requirement: str
    outcome: str
    reason: str
    issue: str
    world_sizes: tuple[int, ...] = ()
    torch: str = ""
    file: str = ""

    def matches(self, result: Result, torch_version: str) -> bool:
        """True when this entry covers ``result`` (same requirement, world size and torch range)."""
        return self.names(result) and self.in_range(torch_version)

    def names(self, result: Result) -> bool:
        """True when this entry is about ``result``'s requirement and world size, whatever the torch."""
        if result.requirement != self.requirement:
            return False
        return not self.world_sizes or result.world_size in self.world_sizes

    def in_range(self, torch_version: str) -> bool:
        """True when the entry's torch range (none: every torch) admits ``torch_version``."""
        return not self.torch or Version(Version(torch_version).base_version) in SpecifierSet(self.torch)

    def to_json(self) -> dict[str, Any]:
        """The entry as the report's ``waivers_used`` lists it."""
        return {
            "requirement": self.requirement,
            "outcome": self.outcome,
            "reason": self.reason,
            "issue": self.issue,
            "world_sizes": list(self.world_sizes),
            "torch": self.torch,
            "file": self.file,
        }


def _nonempty_str(file: str, rid: str, entry: dict, field: str) -> str:
    value = entry.get(field)
    if not isinstance(value, str) or not value.strip():
        raise ExpectationError(file, rid, field, "required, a non-empty string")
    return value.strip()


def _parse_entry(file: str, index: int, entry: object) -> Expectation:
    if not isinstance(entry, dict):
        raise ExpectationError(file, f"#{index}", "<entry>", "each [[expect]] must be a table")
    rid = entry.get("requirement") if isinstance(entry.get("requirement"), str) else f"#{index}"
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ExpectationError(file, rid, unknown[0], f"unknown field; allowed: {', '.join(_FIELDS)}")
    requirement = _nonempty_str(file, rid, entry, "requirement")
    outcome = _nonempty_str(file, rid, entry, "outcome")
    if outcome not in EXPECTED_OUTCOMES:
        raise ExpectationError(file, rid, "outcome", f"{outcome!r} is not one of {EXPECTED_OUTCOMES}")
    reason = _nonempty_str(file, rid, entry, "reason")
    issue = _nonempty_str(file, rid, entry, "issue")
    if not issue.startswith(("https://", "http://")):
        raise ExpectationError(file, rid, "issue", f"{issue!r} is not an http(s) URL")
    sizes = entry.get("world_sizes", [])
    if not isinstance(sizes, list) or not all(type(s) is int and s > 0 for s in sizes):
        raise ExpectationError(file, rid, "world_sizes", "must be a list of positive integers")
    torch_range = entry.get("torch", "")
    if not isinstance(torch_range, str):
        raise ExpectationError(file, rid, "torch", "must be a version range string like '>=2.13,<2.14'")
    try:
        SpecifierSet(torch_range)
    except InvalidSpecifier as exc:
        raise ExpectationError(file, rid, "torch", f"not a version range: {exc}") from None
    return Expectation(requirement, outcome, reason, issue, tuple(sizes), torch_range, file)


def _check_overlaps(file: str, entries: list[Expectation]) -> None:
    for i, a in enumerate(entries):
        for b in entries[i + 1 :]:
            same_sizes = not a.world_sizes or not b.world_sizes or set(a.world_sizes) & set(b.world_sizes)
            if a.requirement == b.requirement and same_sizes and a.torch == b.torch:
                raise ExpectationError(file, a.requirement, "world_sizes", "two entries cover the same runs")


def load_file(path: Path) -> list[Expectation]:
    """Parse one expectation file (zero entries is fine); raises ExpectationError on a bad entry."""
    name = path.name
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationError(name, "<file>", "<toml>", str(exc)) from None
    unknown = sorted(set(data) - {"expect"})
    if unknown:
        raise ExpectationError(name, "<file>", unknown[0], "unknown top-level key; only [[expect]] tables")
    raw = data.get("expect", [])
    if not isinstance(raw, list):
        raise ExpectationError(name, "<file>", "expect", "must be an array of tables ([[expect]])")
    entries = [_parse_entry(name, i, e) for i, e in enumerate(raw)]
    _check_overlaps(name, entries)
    return entries


def load_expectations(target: str, directory: Path | None = None) -> list[Expectation]:
    """The entries of ``<directory>/<target>.toml``; an absent file means no expectations."""
    path = (directory or EXPECTATIONS_DIR) / f"{safe_stem(target)}.toml"
    return load_file(path) if path.exists() else []


def _waiver(entry: Expectation, observed: str) -> dict[str, str]:
    return {
        "requirement": entry.requirement,
        "expected": entry.outcome,
        "observed": observed,
        "reason": entry.reason,
        "issue": entry.issue,
    }


def _stale(entry: Expectation, result: Result) -> dict[str, Any]:
    where = entry.file or "its expectation file"
    return {
        **_waiver(entry, result.outcome),
        "world_size": result.world_size,
        "message": (
            f"{entry.requirement} now passes at world size {result.world_size}: the waiver "
            f"({entry.issue}) is stale and can be removed from {where}"
        ),
    }


def out_of_range(expectations: list[Expectation], torch_version: str | None = None) -> list[dict[str, Any]]:
    """The entries whose torch range excludes ``torch_version`` (default: the running torch)."""
    version = torch_version or torch.__version__
    return [{
        **entry.to_json(),
        "running_torch": version,
        "message": (f"{entry.requirement}: the waiver ({entry.issue}) covers torch {entry.torch}, not {version}: "
                    "out of range, not applied on this run"),
    } for entry in expectations if not entry.in_range(version)]


def _out_of_range_note(result: Result, entries: list[Expectation], version: str) -> Result:
    notes = [f"waiver out of range: it covers torch {e.torch}, not {version}; not applied ({e.issue})"
             for e in entries if e.names(result)]
    return replace(result, notes=[*result.notes, *notes]) if notes else result


def _apply_one(result: Result, entry: Expectation, stale: list[dict[str, Any]]) -> Result:
    observed = result.outcome
    if observed == Outcome.PASS.value:
        stale.append(_stale(entry, result))
        return result
    if observed == entry.outcome and observed in _WAIVABLE:
        return replace(result, outcome=Outcome.WAIVED.value, waiver=_waiver(entry, observed))
    if observed == entry.outcome:
        return replace(result, notes=[*result.notes, f"expected {observed}: {entry.reason} ({entry.issue})"])
    if observed in _WAIVABLE:
        note = f"waiver expects {entry.outcome} but observed {observed}; not waived ({entry.issue})"
        return replace(result, notes=[*result.notes, note])
    return result


def apply_expectations(
    results: list[Result],
    expectations: list[Expectation],
    strict: bool = False,
    *,
    torch_version: str | None = None,
) -> tuple[list[Result], list[dict[str, Any]]]:
    """Apply expectations to results; return (new results, stale waivers).

    A fail/error matching an entry with that same outcome becomes ``waived`` with a ``waiver``
    dict keeping the observed outcome. A pass under an entry stays ``pass`` and is reported
    stale. An outcome other than the expected one is left as is, with a note. A result named only
    by entries out of this torch's range gets a note saying so. With ``strict``, stale waivers
    raise StaleWaiverError (which carries the results and the stale list).
    """
    version = torch_version or torch.__version__
    elsewhere = [e for e in expectations if not e.in_range(version)]
    stale: list[dict[str, Any]] = []
    out: list[Result] = []
    for result in results:
        entry = next((e for e in expectations if e.matches(result, version)), None)
        out.append(_out_of_range_note(result, elsewhere, version) if entry is None
                   else _apply_one(result, entry, stale))
    if strict and stale:
        raise StaleWaiverError(out, stale)
    return out, stale
