"""The rules every check follows (conformance/checks/README.md), enforced on the check sources and on the simulator.

1. Data checks compare with exact expectations, never with another output of the backend: a defect that
   corrupts every path of the backend alike (AVG as SUM, MIN/MAX swapped, the wrong reduce_scatter shard) must
   fail the data requirements, and no check compares two tensors with torch.equal/allclose.
2. A refusal check names what the error must contain.
7. Subgroups carry the check's timeout (ctx.new_group), but where pg_options are the subject (hints.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conformance.runner.pool import PoolSet
from conformance.session import Selection, run_suite

CHECKS = Path(__file__).resolve().parents[1] / "conformance" / "checks"
SOURCES = sorted(CHECKS.glob("*.py"))


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if called == name:
                found.append(node)
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_check_compares_two_tensors_of_the_backend(path: Path) -> None:
    tree = ast.parse(path.read_text())
    bad = [f"{path.name}:{c.lineno} {name}" for name in ("equal", "allclose", "assert_close")
           for c in _calls(tree, name)]
    assert not bad, f"compare with reference.mismatch against exact expected values instead: {bad}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_every_refusal_names_what_the_error_must_contain(path: Path) -> None:
    tree = ast.parse(path.read_text())
    bad = [f"{path.name}:{c.lineno}" for c in _calls(tree, "expect_raises")
           if len(c.args) < 5 and not any(k.arg == "contains" for k in c.keywords)]
    assert not bad, f"expect_raises without contains=...: {bad}"


TIMEOUT_EXEMPT = ("hints.py",)  # its pg_options objects are the subject; registry.py defines ctx.new_group


@pytest.mark.parametrize("path", [p for p in SOURCES if p.name not in TIMEOUT_EXEMPT], ids=lambda p: p.name)
def test_subgroups_carry_the_checks_timeout(path: Path) -> None:
    tree = ast.parse(path.read_text())
    bad = [f"{path.name}:{c.lineno}" for c in _calls(tree, "new_group")
           if isinstance(c.func, ast.Attribute) and getattr(c.func.value, "id", "") == "dist"
           and not any(k.arg == "timeout" for k in c.keywords)]
    assert not bad, f"dist.new_group without the check's timeout (use ctx.new_group): {bad}"


# A defect shared by every path of the backend, and data requirements that must fail on it.
SHARED_PATH = {
    "avg_as_sum": ("COAL-SYNC-RESULTS", "COLL-ALLREDUCE-OPS"),
    "minmax_swapped": ("COAL-SYNC-RESULTS", "COLL-ALLREDUCE-OPS", "COLL-GATHER-SCATTER-ORDER", "COLL-ROOTED"),
    "reduce_scatter_wrong_shard": ("COAL-SYNC-RESULTS", "COLL-GATHER-SCATTER-ORDER"),
    "int_sum_via_float32": ("COAL-SYNC-RESULTS", "COLL-ALLREDUCE-OPS"),
}


@pytest.fixture(scope="module")
def pools():
    pools = PoolSet()
    yield pools
    pools.close()


@pytest.mark.parametrize("defect", sorted(SHARED_PATH))
def test_a_defect_every_path_shares_fails_the_data_requirements(pools: PoolSet, defect: str) -> None:
    ids = SHARED_PATH[defect]
    run = run_suite("sim", [2], selection=Selection(ids=ids), pools=pools, timeout_s=15.0,
                    target_options={"defects": [defect]})
    outcomes = {r.requirement: r.outcome for r in run.results}
    assert outcomes == dict.fromkeys(ids, "fail"), {r.requirement: r.detail[:300] for r in run.results}
