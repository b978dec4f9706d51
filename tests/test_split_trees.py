"""Generated split trees (SPLIT-TREES): their shape, their coverage, and what the audit of a split's records says."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.checks import split_trees
from conformance.checks.common import Findings
from conformance.torch_compat import split_child_ranks


@settings(max_examples=200, deadline=None)
@given(world_size=st.integers(1, 16), seed=st.integers(0, 2**31), budget=st.integers(0, 4))
def test_every_level_splits_every_group_into_parts_of_its_own_ranks(world_size: int, seed: int, budget: int) -> None:
    made = split_trees.trees(world_size, seed, budget)
    assert len(made) == split_trees.TREES_AT_BUDGET_0 + budget
    for tree in made:
        assert len(tree) == split_trees.LEVELS
        groups = [tuple(range(world_size))]
        for splits in tree:
            assert sorted(s.group for s in splits) == sorted(groups)  # each group of the level above, once
            for split in splits:
                ranks = sorted(r for part in split.parts for r in part)
                assert ranks == list(range(len(split.group))), split  # parts hold every group rank once
            groups = [tuple(s.group[r] for r in split_child_ranks(list(p))) for s in splits for p in s.parts]
            assert sorted(r for g in groups for r in g) == list(range(world_size))  # every rank in one child


def test_trees_are_the_same_for_a_seed_and_differ_across_seeds() -> None:
    assert split_trees.trees(8, 5, 2) == split_trees.trees(8, 5, 2)
    assert split_trees.trees(8, 5, 2) != split_trees.trees(8, 6, 2)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_boundary_trees_cover_every_dimension(world_size: int) -> None:
    hit = split_trees.coverage(split_trees.trees(world_size, 23, 0))
    assert {dim: set(values) for dim, values in split_trees.dimensions(world_size).items()} == hit


def test_a_child_maps_its_group_ranks_through_the_parent() -> None:
    split = split_trees.Split(group=(1, 2, 3), parts=((2, 0), (1,)))
    assert sorted(split.child(1)) == [1, 3] and split.child(2) == (2,)


class _Probe:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._events = events

    def events(self, kind: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self._events[since:] if kind in (None, e["kind"])]


def _audit(rank: int, events: list[dict[str, Any]], members: tuple[int, ...] = (1, 3)) -> list[str]:
    ctx = SimpleNamespace(rank=rank, probe=_Probe(events))
    findings = Findings(ctx)  # type: ignore[arg-type]
    split_trees._audit(ctx, findings, 0, members, "parent-comm", "where")  # type: ignore[arg-type]
    return findings.failures


def _comm(members: list[int], mode: str = "split", parent: str = "parent-comm", comm: str = "c") -> dict[str, Any]:
    return {"kind": "comm_created", "comm": comm, "members": members, "mode": mode, "parent": parent}


def test_the_audit_passes_the_right_records() -> None:
    assert _audit(3, [_comm([1, 3]), _comm([1, 3], mode="p2p", parent=None)]) == []
    assert _audit(3, [_comm([3, 1])], members=(3, 1)) == []  # in the child's group-rank order
    assert _audit(3, [_comm([1, 3])], members=(3, 1)) == []  # or sorted
    assert _audit(3, [_comm([3, 1])]) != []  # in neither


@pytest.mark.parametrize(("events", "needle"), [
    ([_comm([0, 1])], "expected [1, 3], observed [0, 1]"),  # group ranks recorded as global ranks
    ([_comm([1, 3], parent="world")], "parent of the child's communicator c: expected parent-comm"),
    ([], "expected 1, observed []"),
    ([_comm([1, 3]), _comm([1, 3], comm="d")], "expected 1, observed"),
    ([_comm([1, 3]), _comm([0, 3], mode="p2p")], "expected members one of [[1, 3]], observed [0, 3]"),
    ([_comm([1, 3]), _comm([0, 1], mode="p2p")], "records members [0, 1] without rank 3"),
])
def test_the_audit_names_each_wrong_record(events: list[dict[str, Any]], needle: str) -> None:
    failures = _audit(3, events)
    assert any(needle in f and f.startswith("rank 3: where: ") for f in failures), failures
