"""The conformance suite as pytest items (collected through conformance.pytest_plugin)."""
