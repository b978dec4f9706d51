"""torch's own front end drives the simulator at world sizes 2, 4, 8 and 16 on a 2-core machine:
init_process_group, new_group, split_group (through the shim), _coalescing_manager, batch_isend_irecv.

The generated data cases run their boundary cases only (``--budget 0``): what is under test is the front end at
scale; every rank draws every member's inputs, so the random samples cost n x more at 16 ranks, and the runs at 2
and 4 try them."""

import pytest

from conformance.checks.cases import DEFAULT_SEED, Generation
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
    with Generation(DEFAULT_SEED, 0).exported():  # the pool of this world size starts its ranks in here
        for rid in FRONT_END:
            result = run_case(pools, REQ[rid], "sim", world_size, timeout_s=90.0)
            assert result.outcome == "pass", f"{rid} at {world_size} ranks: {result.detail}"
