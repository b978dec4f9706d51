"""A correct backend whose peers run at other speeds passes: the checks' plans follow torch's matching rules
(per (source, destination, tag) FIFO; an any-source recv takes whichever matching message comes first), not
the timing of the machine they were written on. P2P-DATA once let the last rank send rank 0 the first message
of its any-source/named mix while rank 0's any-source receives of every rank's 2-element message were still
posted (seen on the simulator at world size 64: rank 0's recv(tag=0) matched rank 63's int32[3]); a slow rank 1
shows it at world size 4."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.runner.pool import PoolSet
from conformance.session import Selection, run_suite

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES / "toyccl") not in sys.path:
    sys.path.insert(0, str(EXAMPLES / "toyccl"))

from tests.vendor.timing_backends import TIMINGS  # noqa: E402


@pytest.fixture(scope="module")
def pools():
    pools = PoolSet()
    yield pools
    pools.close()


@pytest.mark.parametrize("name", sorted(TIMINGS))
def test_a_correct_backend_with_a_slow_peer_passes(pools: PoolSet, name: str) -> None:
    _, requirement = TIMINGS[name]
    run = run_suite("vendor", [4], selection=Selection(ids=(requirement,)), pools=pools, timeout_s=60.0,
                    target_options={"backend": name, "module": "tests.vendor.timing_backends",
                                    "capabilities": ["p2p_tags", "p2p_any_source"]})
    (result,) = run.results
    assert result.outcome == "pass", f"{name} on {requirement}: {result.outcome}: {result.detail}"
