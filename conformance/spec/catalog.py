"""Load and validate the requirement catalog (TOML data files, one per area)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from conformance.spec.datafile import SpecError, admits, entry_name, load_tables, version_range

AREAS: tuple[str, ...] = ("qualification", "split", "hints", "p2p", "coalescing", "collectives", "api")
SPEC_DIR = Path(__file__).parent


@dataclass(frozen=True)
class Requirement:
    """One requirement of the spec."""

    id: str
    area: str
    level: str
    statement: str
    rationale: str
    source: str
    capabilities: tuple[str, ...]
    torch: str
    world_sizes: tuple[int, ...] = ()
    min_world_size: int = 2
    finding: str = ""
    kind: str = "backend"
    finding_torch: str = ""
    skip_stacks: tuple[tuple[str, str], ...] = ()

    def not_on_stack(self, stack: str | None) -> str | None:
        """Why the requirement does not apply on ``stack`` (the spec's ``skip_stacks``), or None."""
        return dict(self.skip_stacks).get(stack or "")

    def applies_to_torch(self, version: str) -> bool:
        """True when the requirement's torch range admits ``version`` (local tags ignored)."""
        return admits(self.torch, version)

    def finding_holds(self, version: str) -> bool:
        """True when the spec's finding holds on torch ``version`` (its ``finding_torch`` range, else always)."""
        if not self.finding:
            return False
        return admits(self.finding_torch, version)

    def finding_text(self, version: str) -> str:
        """The finding as a report states it on torch ``version``: held, or fixed upstream since."""
        if not self.finding:
            return ""
        if self.finding_holds(version):
            return f"Finding: {self.finding}"
        return f"Finding (torch {self.finding_torch}; fixed upstream, does not hold on {version}): {self.finding}"

    def applies_to_world_size(self, world_size: int) -> bool:
        """True when the requirement runs at ``world_size``: one of those listed, else any size from its
        ``min_world_size`` (2 unless the spec says 1: what ranks exchange cannot be exercised by one rank)."""
        return world_size in self.world_sizes if self.world_sizes else world_size >= self.min_world_size

    def smallest_world_size(self, sizes: list[int]) -> int:
        """The smallest of the sorted ``sizes`` the requirement runs at (the first, when none applies)."""
        return next((n for n in sizes if self.applies_to_world_size(n)), sizes[0])


def _requirement(file: str, index: int, entry: dict) -> Requirement:
    rid = entry_name(entry, "id", index)
    for key in ("torch", "finding_torch"):
        version_range(entry.get(key, ""), file, rid, key)
    if "finding_torch" in entry and not entry.get("finding"):
        raise SpecError(file, rid, "finding_torch", "a finding_torch range needs a finding")
    return Requirement(
        id=entry["id"],
        area=Path(file).stem,
        level=entry["level"],
        statement=entry["statement"],
        rationale=entry["rationale"],
        source=entry["source"],
        capabilities=tuple(entry["capabilities"]),
        torch=entry["torch"],
        world_sizes=tuple(entry.get("world_sizes", ())),
        min_world_size=entry.get("min_world_size", 2),
        finding=entry.get("finding", ""),
        kind=entry.get("kind", "backend"),
        finding_torch=entry.get("finding_torch", ""),
        skip_stacks=tuple(sorted(entry.get("skip_stacks", {}).items())),
    )


def load_file(path: Path) -> list[Requirement]:
    """Parse one area file; raises SpecError naming file, id and field."""
    if path.stem not in AREAS:
        raise SpecError(path.name, "<file>", "<name>", f"unknown area {path.stem!r}; expected one of {AREAS}")
    entries = load_tables(path, "requirement", "schema.json", key="id", required=True)
    return [_requirement(path.name, i, e) for i, e in enumerate(entries)]


def load_catalog(spec_dir: Path | None = None) -> list[Requirement]:
    """Load every area file, check ids are unique, return requirements in file order.

    The shipped catalog is parsed and validated once per process; another ``spec_dir`` every call.
    """
    return list(_shipped_catalog() if spec_dir is None else _load(spec_dir))


@cache
def _shipped_catalog() -> tuple[Requirement, ...]:
    return _load(Path(str(resources.files("conformance.spec"))))


def _load(base: Path) -> tuple[Requirement, ...]:
    requirements: list[Requirement] = []
    seen: dict[str, str] = {}
    for area in AREAS:
        path = base / f"{area}.toml"
        if not path.exists():
            raise SpecError(path.name, "<file>", "<file>", "area file is missing")
        for req in load_file(path):
            if req.id in seen:
                raise SpecError(path.name, req.id, "id", f"duplicate id, first defined in {seen[req.id]}")
            seen[req.id] = path.name
            requirements.append(req)
    return tuple(requirements)
