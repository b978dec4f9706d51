"""The result of one requirement x target x world size, as the report stores it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Result:
    """One row of a report's ``results`` list."""

    requirement: str
    area: str
    level: str
    world_size: int
    outcome: str
    detail: str
    duration_s: float
    target: str = ""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    waiver: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object for this result."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        """Inverse of to_json."""
        return cls(**data)
