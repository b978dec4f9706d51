"""A pytest plugin for tests/test_xdist_reports.py: logs which process (controller or xdist worker) writes a report."""

from __future__ import annotations

import os

import pytest

import conformance.pytest_plugin as plugin


def pytest_configure(config: pytest.Config) -> None:
    who = config.workerinput["workerid"] if hasattr(config, "workerinput") else "controller"
    real = plugin.write_report

    def spy(report, report_dir, statements=None):
        with open(os.environ["CFM_WRITE_SPY"], "a") as f:
            f.write(f"{who} {report['target']} interrupted={report['interrupted']} n={len(report['results'])}\n")
        return real(report, report_dir, statements)

    plugin.write_report = spy
