"""Run a list of torch's DistributedTest tests on one backend at one world size; one JSON line per test.

Usage: ``python -m conformance.fidelity.worker --backend sim --world-size 2 --out results.jsonl test_a test_b``.
The environment torch's test module reads at import (BACKEND=gloo, WORLD_SIZE, TEMP_DIR, INIT_METHOD) is
set here before it is imported; each test spawns its ranks as upstream's test_distributed_spawn.py does.
Each test's simulator segments carry a prefix of their own, so a segment left in /dev/shm after every rank
has exited is charged to the test that left it (and then removed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import unittest
from typing import Any

from conformance.outcomes import Outcome
from simulator import shm

ABSENT = "absent"  # the test is not in this torch's DistributedTest
TIMEOUT_S = 120  # per test, all ranks (torch's default is 300 s)
_EXC_LINE = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*: \S")  # "ValueError: ...", "simulator.errors.RankTimeout: ..."
_WRAPPER = "RuntimeError: Process "  # torch's harness wraps a rank's traceback in this line


def summary(text: str) -> str:
    """The last exception line of a traceback text, a rank's own before torch's wrapper (the tail if none)."""
    lines = [ln.strip() for ln in text.splitlines() if _EXC_LINE.match(ln.strip())]
    own = [ln for ln in lines if not ln.startswith(_WRAPPER)] or lines
    return (own[-1] if own else text.strip().splitlines()[-1] if text.strip() else "")[:400]


def leftover_segments(prefix: str) -> list[str]:
    """Names in /dev/shm that start with ``prefix``."""
    return sorted(n for n in os.listdir(shm.SHM_DIR) if n.startswith(prefix))


def probe_sees_segments(prefix: str) -> bool:
    """Positive control of the leak check: a segment made under ``prefix`` is seen, then removed."""
    name = f"{prefix}control"
    shm.create(name, 8)
    seen = leftover_segments(prefix) == [name]
    shm.unlink(name)
    return seen and not leftover_segments(prefix)


def run_one(case: type[unittest.TestCase], name: str, prefix: str) -> dict[str, Any]:
    """Run test ``name``; its outcome, message, seconds and the segments it left."""
    os.environ["SIM_SHM_PREFIX"] = prefix
    result = unittest.TestResult()
    start = time.monotonic()
    case(name).run(result)
    seconds = round(time.monotonic() - start, 2)
    record: dict[str, Any] = {"test": name, "seconds": seconds, "outcome": Outcome.PASS, "message": ""}
    if result.failures or result.errors:
        text = (result.failures + result.errors)[0][1]
        record.update(outcome=Outcome.FAIL, message=summary(text), detail=text[-4000:])
    elif result.skipped:
        record.update(outcome=Outcome.SKIP, message=str(result.skipped[0][1])[:400])
    leaked = leftover_segments(prefix)
    if leaked:
        record["leaked_segments"] = leaked
        for seg in leaked:
            shm.unlink(seg)
    return record


def main(argv: list[str] | None = None) -> int:
    """Run the tests named on the command line; append one JSON object per test to --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("gloo", "sim"), required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("tests", nargs="+")
    args = ap.parse_args(argv)
    temp = tempfile.mkdtemp(prefix="fidelity")
    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(args.world_size), TEMP_DIR=temp,
                      INIT_METHOD=f"file://{temp}/shared_init_file", FIDELITY_BACKEND=args.backend,
                      DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(TIMEOUT_S), PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    from conformance.fidelity.upstream import TARGET_ENV, UpstreamDistributedTest

    assert os.environ[TARGET_ENV] == args.backend
    stem = f"simfid{os.getpid()}"
    control = probe_sees_segments(f"{stem}c_")
    with open(args.out, "a") as out:
        out.write(json.dumps({"control": {"leak_probe_sees_segments": control}}) + "\n")
        for i, name in enumerate(args.tests):
            if not hasattr(UpstreamDistributedTest, name):
                record: dict[str, Any] = {"test": name, "outcome": ABSENT, "message": "not in this torch"}
            else:
                record = run_one(UpstreamDistributedTest, name, f"{stem}t{i}_")
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(f"[{args.backend} ws{args.world_size}] {name}: {record['outcome']} {record.get('seconds', '')}s "
                  f"{record['message'][:160]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
