"""Settings for the processes of the suite's own tests (and every process they start, which inherits them).

torch's c10d formats socket addresses with getnameinfo, a reverse lookup; a TCPStore client connects over an
IPv6 socket to ``::ffff:127.0.0.1``, which /etc/hosts does not name, so the lookup goes to the DNS resolver.
On a host whose resolver drops some queries, glibc then waits its default 5 s before asking again: about one
store connect in 25 stalled for 5 s here (tests/clients/test_many_groups.py tells the story). A 1 s wait per
attempt, two attempts, bounds that stall at 1 s; an answer that merely comes late is not needed (the lookup
only names the address in torch's log lines, and falls back to the numeric form). A value set by the caller
wins.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:2")

# Python caches the bytecode of what it imports; a machine that exports PYTHONDONTWRITEBYTECODE=1 (the
# development host does) keeps none, and every process these tests start compiles torch's modules again: `import
# torch` took 10 s there without a cache and 4 s with one, and DDP's constructor, which imports torch._dynamo
# (sympy too), 13 s without (8.6 s of it in compile()), so each DDP item spent most of its 30 s compiling. The
# suite's processes and the ones they start write the cache (the mutation harness's judges turn it off for
# themselves: a mutant must never read another's bytecode).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


# pytest-xdist's load scheduler hands each worker a quarter of its share up front (about 110 items here), and
# then up to --maxschedchunk more per finished item while a worker holds fewer than a quarter of what is left:
# a worker running fast items hoards slow ones. In one run the longest items, first in the order below, all
# landed on one worker, which finished 48-84 s after the other. One item at a time (a worker holds at most
# two) lets the order below decide.
XDIST_CHUNK = 1


def pytest_configure(config: pytest.Config) -> None:
    """Small xdist scheduling chunks (``--maxschedchunk``), unless the caller set them."""
    if hasattr(config.option, "maxschedchunk") and config.option.maxschedchunk is None:
        config.option.maxschedchunk = XDIST_CHUNK


# Modules that test the suite's own machinery (the mutation harness, signals and interrupted reports, xdist report
# writing, vendor-import isolation, the CLI's argument checks, target registration by entry point, the rank pools,
# report rendering, the spec loader, the check-source rules, CI's own pin and README): what they judge is ours, not
# torch's, and the simulator they drive is judged on the newest torch by CI's stage 2 run and by the items left
# unmarked. Marked ``harness``; CI's stage 2 (.ci/run) leaves them out; on another torch run them with
# `pytest tests -m harness` in its venv.
HARNESS_MODULES = frozenset({
    "test_mutation.py", "test_interrupts.py", "test_xdist_reports.py", "test_certify_import.py", "test_cli.py",
    "test_bad_input.py", "test_torch_pin.py", "test_readme.py", "test_spec.py", "test_check_rules.py",
    "test_runner_faults.py", "vendor/test_registration.py", "runner/test_pool.py", "runner/test_hangs.py",
    "runner/test_messages.py", "report/test_expectations.py", "report/test_judged.py", "report/test_records.py",
    "report/test_report.py"})
# Modules that measure the checks' power on planted vendor bugs (toyccl variants, gap backends): each must fail its
# requirement. Marked ``teeth``; like the defect matrix they run on CI's first torch, and CI's stage 2 leaves them
# out (a whole-suite teeth measure per torch: scripts/torch_versions.py).
TEETH_MODULES = frozenset({"vendor/test_variants.py", "vendor/test_gap_backends.py"})
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the items of ``HARNESS_MODULES`` ``harness`` and those of ``TEETH_MODULES`` ``teeth``. Run the longest
    items first, so that pytest-xdist's workers finish together instead of one of them starting the defect matrix
    (tens of seconds) while the other runs out of work: items marked ``slow``, then those of modules that start
    processes with ``subprocess`` (seconds each), then the rest, each in collection order."""
    for item in items:
        where = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else ""
        if where in HARNESS_MODULES:
            item.add_marker(pytest.mark.harness)
        if where in TEETH_MODULES:
            item.add_marker(pytest.mark.teeth)

    def cost(item: pytest.Item) -> int:
        if item.get_closest_marker("slow"):
            return 0
        return 1 if hasattr(getattr(item, "module", None), "subprocess") else 2

    items.sort(key=cost)
