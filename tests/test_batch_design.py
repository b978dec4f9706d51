"""What a lazy group's first batch may make: its ring pairs' 2-rank communicators, or the group's own (as
ProcessGroupNCCL does), and nothing else."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from conformance.checks.p2p import batch_design


def _made(*comms: tuple[str, list[int]]) -> list[dict[str, Any]]:
    return [{"mode": mode, "members": members, "comm": f"c{k}"} for k, (mode, members) in enumerate(comms)]


RANK1_OF_4 = SimpleNamespace(rank=1, world_size=4)  # its ring pairs: (0, 1) and (1, 2)


@pytest.mark.parametrize(("made", "design"), [
    (_made(("p2p", [0, 1]), ("p2p", [1, 2])), "pairs"),
    (_made(("lazy", [0, 1, 2, 3])), "group"),
])
def test_either_design_is_accepted(made: list[dict[str, Any]], design: str) -> None:
    assert batch_design(RANK1_OF_4, made) == (design, "")


@pytest.mark.parametrize("made", [
    _made(),  # nothing made: the batch ran on no communicator the probe saw
    _made(("p2p", [0, 1])),  # one ring pair's only
    _made(("p2p", [0, 1]), ("p2p", [1, 2]), ("lazy", [0, 1, 2, 3])),  # both
    _made(("p2p", [0, 1]), ("p2p", [1, 2]), ("p2p", [1, 3])),  # a pair outside the ring
    _made(("lazy", [0, 1, 2, 3]), ("lazy", [0, 1, 2, 3])),  # the group's twice
    _made(("lazy", [1, 2])),  # a group communicator of some members only
])
def test_anything_else_is_a_problem_naming_the_rank_and_what_was_made(made: list[dict[str, Any]]) -> None:
    design, problem = batch_design(RANK1_OF_4, made)
    assert design == ""
    assert problem.startswith("communicators made on rank 1: expected the 2-rank ones of its ring pairs "
                              "[(0, 1), (1, 2)], or one of every rank and no pair one, observed (mode, members) ")
    assert str([(e["mode"], e["members"]) for e in made]) in problem
