"""The fidelity job's selection (``selection.toml``): upstream test names by area, and gloo-only tests."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

SELECTION = Path(__file__).with_name("selection.toml")


@dataclass(frozen=True)
class GlooOnly:
    """Tests only gloo can pass, with the reason and the upstream lines it rests on."""

    tests: tuple[str, ...]
    reason: str
    source: tuple[str, ...]


@dataclass(frozen=True)
class Selection:
    """Upstream test names by area, and the gloo-only groups."""

    areas: dict[str, tuple[str, ...]]
    gloo_only: dict[str, GlooOnly]

    @property
    def tests(self) -> list[str]:
        """Every selected test, area by area, in file order."""
        return [t for names in self.areas.values() for t in names]

    def area_of(self, test: str) -> str:
        """The area a selected test belongs to."""
        return next(a for a, names in self.areas.items() if test in names)

    def gloo_only_reason(self, test: str) -> GlooOnly | None:
        """The gloo-only group naming ``test``, if any."""
        return next((g for g in self.gloo_only.values() if test in g.tests), None)


def load(path: Path = SELECTION) -> Selection:
    """Read and check a selection file (every gloo-only test must be selected; no test twice)."""
    data = tomllib.loads(path.read_text())
    areas = {a: tuple(names) for a, names in data["areas"].items()}
    flat = [t for names in areas.values() for t in names]
    twice = sorted({t for t in flat if flat.count(t) > 1})
    if twice:
        raise ValueError(f"{path}: tests listed twice: {twice}")
    gloo_only = {k: GlooOnly(tuple(v["tests"]), " ".join(v["reason"].split()), tuple(v["source"]))
                 for k, v in data.get("gloo_only", {}).items()}
    stray = sorted(t for g in gloo_only.values() for t in g.tests if t not in flat)
    if stray:
        raise ValueError(f"{path}: gloo_only names tests not in any area: {stray}")
    return Selection(areas, gloo_only)
