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

import pytest

os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:2")


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the longest items first, so that pytest-xdist's workers finish together instead of one of them
    starting the defect matrix (tens of seconds) while the other runs out of work: items marked ``slow``,
    then those of modules that start processes with ``subprocess`` (seconds each), then the rest, each in
    collection order."""
    def cost(item: pytest.Item) -> int:
        if item.get_closest_marker("slow"):
            return 0
        return 1 if hasattr(getattr(item, "module", None), "subprocess") else 2

    items.sort(key=cost)
