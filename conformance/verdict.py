"""The verdict of a report and the exit code a front door maps it to; below both front doors, so that the CLI,
the defect matrix and the framework check share them without importing each other."""

from __future__ import annotations

import enum


class Verdict(enum.StrEnum):
    """The certification verdicts, strongest claim first; the value is what reports spell."""

    CONFORMANT = "conformant"
    CONFORMANT_WITH_WAIVERS = "conformant-with-waivers"
    NON_CONFORMANT = "non-conformant"
    INCOMPLETE = "incomplete"

    @property
    def symbol(self) -> str:
        """The mark a Markdown report puts before the verdict."""
        return {"conformant": "✅", "conformant-with-waivers": "🛈", "non-conformant": "❌", "incomplete": "⏸"}[self]

    @property
    def meaning(self) -> str:
        """What the verdict claims, as a report's summary says it."""
        return {
            "conformant": "every backend MUST requirement that was judged passed",
            "conformant-with-waivers": "no backend MUST requirement failed except known defects waived by the "
                                       "target's expectation file",
            "non-conformant": "at least one backend MUST requirement failed or errored (see Failures)",
            "incomplete": "the run was interrupted, or no backend MUST requirement could be judged: no claim is made",
        }[self]


class ExitCode(enum.IntEnum):
    """What ``python -m conformance`` exits with."""

    OK = 0  # conformant, conformant-with-waivers, or a command with nothing to judge
    NON_CONFORMANT = 1  # a MUST failed (or, for `defects`, a target of the matrix was missed)
    BAD_INPUT = 2  # refused before anything ran
    INCOMPLETE = 3  # interrupted, or no MUST could be judged
    STALE_WAIVER = 4  # --strict-waivers found a waiver whose requirement now passes

    @classmethod
    def for_verdict(cls, verdict: str) -> ExitCode:
        """The exit code of a report's verdict."""
        return {Verdict.CONFORMANT: cls.OK, Verdict.CONFORMANT_WITH_WAIVERS: cls.OK,
                Verdict.INCOMPLETE: cls.INCOMPLETE}.get(Verdict(verdict), cls.NON_CONFORMANT)
