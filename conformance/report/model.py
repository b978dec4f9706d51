"""The records a case passes through: what each rank reports, and the result of the case.

Like pytest's CallInfo and TestReport: a ``RankOutcome`` is what one rank saw (or how its process
failed), a ``Result`` is the case (one requirement x target x world size) the report stores. Both
carry ``Outcome`` members, and both have one wire form, ``to_json``/``from_json``: the pool and
torchrun carry rank outcomes in it, pytest-xdist carries results in it, and the report stores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from conformance.outcomes import Outcome


@dataclass
class RankOutcome:
    """What one rank reports for one case.

    ``status`` is set only when the runner, not the check, decided the outcome: the rank's process
    ``raised`` outside the check, ``crashed``, hit the ``timeout``, or was ``aborted`` after a peer
    failed (``exitcode`` then says how a crashed process ended). ``duration_s`` is the rank's own
    time, which travels to the parent but is not stored in the report.
    """

    rank: int
    outcome: Outcome
    detail: str = ""
    traceback: str = ""
    notes: list[str] = field(default_factory=list)
    status: str | None = None
    exitcode: int | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)

    def to_json(self) -> dict[str, Any]:
        """The JSON-able dict of this rank outcome (the runner's fields only when the runner decided)."""
        data: dict[str, Any] = {"rank": self.rank, "outcome": self.outcome.value, "detail": self.detail,
                                "traceback": self.traceback, "notes": list(self.notes)}
        if self.status is not None:
            data |= {"status": self.status, "exitcode": self.exitcode}
        if self.duration_s is not None:
            data["duration_s"] = self.duration_s
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankOutcome:
        """Inverse of to_json; an unknown outcome string is a ValueError."""
        return cls(rank=data["rank"], outcome=data["outcome"], detail=data.get("detail", ""),
                   traceback=data.get("traceback", ""), notes=list(data.get("notes", ())),
                   status=data.get("status"), exitcode=data.get("exitcode"), duration_s=data.get("duration_s"))


@dataclass
class Result:
    """The result of one case: one row of a report's ``results`` list."""

    requirement: str
    area: str
    level: str
    world_size: int
    outcome: Outcome
    detail: str
    duration_s: float
    target: str = ""
    ranks: list[RankOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    waiver: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)

    def to_json(self) -> dict[str, Any]:
        """The JSON object for this result."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "outcome": self.outcome.value, "ranks": [r.to_json() for r in self.ranks], "notes": list(self.notes),
            "waiver": None if self.waiver is None else dict(self.waiver)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        """Inverse of to_json."""
        return cls(**{**data, "ranks": [RankOutcome.from_json(r) for r in data.get("ranks", ())]})
