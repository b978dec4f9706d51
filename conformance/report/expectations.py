"""Per-target expectation (waiver) files: load (through spec.datafile), apply, and detect stale waivers.

A file ``conformance/expectations/<target>.toml`` holds ``[[expect]]`` tables, each naming a
requirement the target is known to fail, why, and the upstream issue. Applying them turns a
matching fail/error into ``waived`` (never ``pass``); an entry whose requirement now passes
is a stale waiver. An entry scoped to a torch range that excludes the running torch is not
applied, and is reported as out of range (a note on each result it names, and a list in the
report), never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from conformance.outcomes import Outcome
from conformance.report.model import Result
from conformance.report.write import safe_stem
from conformance.spec.datafile import SpecError, admits, entry_name, load_tables, version_range

EXPECTATIONS_DIR = Path(__file__).resolve().parent.parent / "expectations"


class StaleWaiverError(RuntimeError):
    """Strict mode found waivers whose requirement now passes; carries the results and the list."""

    def __init__(self, results: list[Result], stale: list[dict[str, Any]]) -> None:
        self.results, self.stale = results, stale
        super().__init__("stale waivers: " + "; ".join(s["message"] for s in stale))


@dataclass(frozen=True)
class Expectation:
    """One ``[[expect]]`` entry: a known failure of one requirement on one target."""

    requirement: str
    outcome: Outcome
    reason: str
    issue: str
    world_sizes: tuple[int, ...] = ()
    torch: str = ""
    file: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))

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
        return admits(self.torch, torch_version)

    def to_json(self) -> dict[str, Any]:
        """The entry as the report's ``waivers_used`` lists it."""
        return {
            "requirement": self.requirement,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "issue": self.issue,
            "world_sizes": list(self.world_sizes),
            "torch": self.torch,
            "file": self.file,
        }


def _expectation(file: str, index: int, entry: dict[str, Any]) -> Expectation:
    rid = entry_name(entry, "requirement", index)
    torch_range = version_range(entry.get("torch", ""), file, rid, "torch")
    return Expectation(entry["requirement"].strip(), entry["outcome"], entry["reason"].strip(),
                       entry["issue"].strip(), tuple(entry.get("world_sizes", ())), torch_range, file)


def _check_overlaps(file: str, entries: list[Expectation]) -> None:
    for i, a in enumerate(entries):
        for b in entries[i + 1 :]:
            same_sizes = not a.world_sizes or not b.world_sizes or set(a.world_sizes) & set(b.world_sizes)
            if a.requirement == b.requirement and same_sizes and a.torch == b.torch:
                raise SpecError(file, a.requirement, "world_sizes", "two entries cover the same runs")


def load_file(path: Path) -> list[Expectation]:
    """Parse one expectation file (zero entries is fine); raises SpecError on a bad entry."""
    entries = load_tables(path, "expect", "expectation.schema.json", key="requirement", required=False)
    expectations = [_expectation(path.name, i, e) for i, e in enumerate(entries)]
    _check_overlaps(path.name, expectations)
    return expectations


def load_expectations(target_name: str, directory: Path | None = None) -> list[Expectation]:
    """The entries of ``<directory>/<target_name>.toml``; an absent file means no expectations."""
    path = (directory or EXPECTATIONS_DIR) / f"{safe_stem(target_name)}.toml"
    return load_file(path) if path.exists() else []


def _waiver(entry: Expectation, observed: Outcome) -> dict[str, str]:
    return {
        "requirement": entry.requirement,
        "expected": entry.outcome.value,
        "observed": observed.value,
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
    if observed is Outcome.PASS:
        stale.append(_stale(entry, result))
        return result
    if observed is entry.outcome and observed.failing:
        return replace(result, outcome=Outcome.WAIVED, waiver=_waiver(entry, observed))
    if observed is entry.outcome:
        return replace(result, notes=[*result.notes, f"expected {observed}: {entry.reason} ({entry.issue})"])
    if observed.failing:
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
    stale, unless the same entry still fails at another world size of the run. An outcome other
    than the expected one is left as is, with a note. A result named only by entries out of this
    torch's range gets a note saying so. With ``strict``, stale waivers raise StaleWaiverError
    (which carries the results and the stale list).
    """
    version = torch_version or torch.__version__
    elsewhere = [e for e in expectations if not e.in_range(version)]
    stale_by_entry: dict[int, list[dict[str, Any]]] = {}
    still_failing: set[int] = set()
    out: list[Result] = []
    for result in results:
        entry = next((e for e in expectations if e.matches(result, version)), None)
        if entry is None:
            out.append(_out_of_range_note(result, elsewhere, version))
            continue
        out.append(_apply_one(result, entry, stale_by_entry.setdefault(id(entry), [])))
        if result.outcome.failing:
            still_failing.add(id(entry))
    # a waiver that still fails at another world size of this run is not stale where it passes (world size 1)
    stale = [s for key, found in stale_by_entry.items() if key not in still_failing for s in found]
    if strict and stale:
        raise StaleWaiverError(out, stale)
    return out, stale
