"""torch's own ``DistributedTest._DistTestBase``, run with the decorators torch applies for gloo.

Import this module only with ``BACKEND=gloo`` (and WORLD_SIZE, TEMP_DIR, INIT_METHOD) in the environment:
torch's test module reads BACKEND once, at import, to decide which tests it enables and skips. Each rank
process then runs the test body against the backend named by ``FIDELITY_BACKEND`` ("gloo", or "sim": the
simulator registered as an out-of-tree backend), so the simulator runs exactly the tests torch enables for
gloo, and every ``BACKEND`` the test body reads at run time names the backend under test.
"""

from __future__ import annotations

import os
from typing import Any

import torch.multiprocessing
from torch.testing._internal.distributed import distributed_test
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

TARGET_ENV = "FIDELITY_BACKEND"
START_ENV = "FIDELITY_START_METHOD"  # "spawn" (upstream's, the default) or "fork" (no torch import per rank)

if os.environ.get("BACKEND") != "gloo":
    raise RuntimeError("conformance.fidelity.upstream must be imported with BACKEND=gloo (torch's test module "
                       f"decides at import which tests it enables); got BACKEND={os.environ.get('BACKEND')!r}")


def select_backend() -> str:
    """In a rank process: point torch's test module at the backend under test (registering the simulator)."""
    target = os.environ.get(TARGET_ENV, "gloo")
    if target == "sim":
        import simulator

        simulator.register()
    distributed_test.BACKEND = target
    os.environ["BACKEND"] = target
    return target


class UpstreamDistributedTest(TestDistBackend, DistributedTest._DistTestBase):
    """As torch's test/distributed/test_distributed_spawn.py builds it: the ranks are started per test, spawned
    (upstream's way) or, with FIDELITY_START_METHOD=fork, forked from this process (faster: no import per rank)."""

    def setUp(self) -> None:
        super().setUp()
        if os.environ.get(START_ENV, "spawn") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any) -> None:
        select_backend()
        super()._run(rank, test_name, file_name, pipe, **kwargs)
