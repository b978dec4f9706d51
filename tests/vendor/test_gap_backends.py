"""Teeth of the generated cases: toyccl variants whose one bug lies outside the checks' hand-picked cases
(tests/vendor/gap_backends.py) each fail the requirement named for them, the failure naming the smallest
failing case and the seed; plain toyccl passes those requirements (tests/vendor/test_variants.py's pattern)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.runner.pool import PoolSet
from conformance.session import Selection, run_suite

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES / "toyccl") not in sys.path:
    sys.path.insert(0, str(EXAMPLES / "toyccl"))

from tests.vendor.gap_backends import GAPS  # noqa: E402

MODULE = "tests.vendor.gap_backends"
CAPABILITIES = ["p2p_tags", "p2p_any_source"]
# What the failure must name (the generated dimension value that exposes the bug).
SYMPTOM = {
    "gap_big_tail": "size=64KiB+1e",
    "gap_uint8_signed": "dtype=uint8",
    "gap_gather_offset": "offset",
    "gap_bcast_big_root": "kind=broadcast",
    "gap_reduce_op": "kind=reduce",
    "gap_anysource_tag": "source=any",
    "gap_empty_send": "IndexError",
    "gap_int64_double": "dtype=int64",
    "gap_nd_first_row": "layout=N-D",
    "gap_coalesced_64": "count=65",
    "gap_bf16_half": "dtype=bfloat16",
}


@pytest.fixture(scope="module")
def pools():
    pools = PoolSet()
    yield pools
    pools.close()


def _result(pools: PoolSet, backend: str, module: str, requirement: str) -> tuple[str, str]:
    run = run_suite("vendor", [2], selection=Selection(ids=(requirement,)), pools=pools, timeout_s=30.0,
                    target_options={"backend": backend, "module": module, "capabilities": CAPABILITIES})
    (result,) = run.results
    return result.outcome, result.detail


def test_every_gap_has_a_symptom() -> None:
    assert set(SYMPTOM) == set(GAPS)


@pytest.mark.parametrize("name", sorted(GAPS))
def test_gap_fails_its_requirement_naming_the_smallest_case(pools: PoolSet, name: str) -> None:
    cls, requirement = GAPS[name]
    outcome, detail = _result(pools, name, MODULE, requirement)
    assert outcome in ("fail", "error") and SYMPTOM[name] in detail, f"{name} ({cls.__doc__}): {outcome}: {detail}"
    assert "(seed 23" in detail or "seed 23, reproduce" in detail, detail  # the smallest case, or the case that erred


@pytest.mark.parametrize("requirement", sorted({req for _, req in GAPS.values()}))
def test_plain_toyccl_passes_those_requirements(pools: PoolSet, requirement: str) -> None:
    outcome, detail = _result(pools, "toyccl", "toyccl", requirement)
    # COLL-ROOTED errors on plain toyccl only where its sweep reaches a call toyccl lacks (see test_variants)
    assert outcome == "pass" or (requirement == "COLL-ROOTED" and outcome == "error"), detail
