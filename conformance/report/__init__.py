"""From results to reports: JSON (versioned schema), Markdown matrix, waivers, verdict, digest."""

from conformance.report.build import build_report, compute_verdict, verify_digest, with_invocation
from conformance.report.environment import collect_environment
from conformance.report.expectations import (
    Expectation,
    StaleWaiverError,
    apply_expectations,
    load_expectations,
    out_of_range,
)
from conformance.report.markdown import render_markdown
from conformance.report.model import RankOutcome, Result
from conformance.report.write import load_report, write_report

__all__ = [
    "Expectation",
    "RankOutcome",
    "Result",
    "StaleWaiverError",
    "apply_expectations",
    "build_report",
    "collect_environment",
    "compute_verdict",
    "load_expectations",
    "load_report",
    "out_of_range",
    "render_markdown",
    "verify_digest",
    "with_invocation",
    "write_report",
]
