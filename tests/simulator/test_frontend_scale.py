"""torch's own front end drives the simulator at world sizes 2, 4, 8 and 16 on a 2-core machine:
init_process_group, new_group, split_group (through the shim), _coalescing_manager, batch_isend_irecv."""

import pytest

from conformance.runner.orchestrate import run_case
from conformance.runner.pool import PoolSet
from conformance.spec import load_catalog

REQ = {r.id: r for r in load_catalog()}
FRONT_END = ("SPLIT-MEMBERSHIP", "HINT-NEWGROUP-OPTIONS", "COAL-SYNC-RESULTS", "COAL-ASYNC-WAIT", "COAL-BATCH-WAIT",
             "P2P-EAGER-REUSE")


@pytest.fixture(scope="module")
def pools():
    p = PoolSet()
    yield p
    p.close()


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [8, 16])
def test_front_end_at_scale(pools, world_size) -> None:
    for rid in FRONT_END:
        result = run_case(pools, REQ[rid], "sim", world_size, timeout_s=90.0)
        assert result.outcome == "pass", f"{rid} at {world_size} ranks: {result.detail}"
