"""Checks, one module per area, each bound to a requirement id."""

from conformance.checks.registry import CheckContext, bind_checks, check, load_checks

__all__ = ["CheckContext", "bind_checks", "check", "load_checks"]
