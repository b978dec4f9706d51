"""Generated programs (API-OP-PROGRAMS): what they draw, the exactness of their values, and their shrinker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.checks import program_runs, program_steps
from conformance.checks import programs as pg
from conformance.checks.programs import Step


def _exact_in(values: list[float], dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds each of ``values`` exactly."""
    if dtype.is_floating_point:
        return torch.tensor(values, dtype=torch.float64).to(dtype).double().tolist() == [float(v) for v in values]
    info = torch.iinfo(dtype)
    return all(info.min <= v <= info.max and v == int(v) for v in values)


@settings(max_examples=400, deadline=None)
@given(dtype=st.sampled_from(pg.DTYPES), size=st.integers(1, 64), op=st.sampled_from(pg.REDUCE_OPS),
       index=st.integers(0, 10_000), first=st.integers(0, 64))
def test_inputs_and_their_reductions_are_exact_in_the_dtype(dtype: torch.dtype, size: int, op: str, index: int,
                                                            first: int) -> None:
    if op == "AVG" and (not dtype.is_floating_point or size & (size - 1)):
        return  # programs never draw AVG there
    if op.startswith("B") and dtype.is_floating_point:
        return
    step = Step(index=index, kind="all_reduce", group=0, dtype=dtype, numel=9, op=op, root=0, tag=0,
                is_async=False)
    members = list(range(first, first + size))
    columns = [pg.values(step, m, 0, 9, size) for m in members]
    for column in columns:
        assert _exact_in(column.tolist(), dtype), (dtype, size, op, column)
    assert _exact_in(pg.reduced(op, columns).tolist(), dtype), (dtype, size, op)


def test_values_tell_the_senders_apart() -> None:
    step = Step(index=3, kind="all_gather", group=0, dtype=torch.float32, numel=4, op="SUM", root=0, tag=0,
                is_async=False)
    sent = {tuple(pg.values(step, sender, 0, 4, 8).tolist()) for sender in range(8)}
    assert len(sent) == 8


def test_int_values_sit_past_float_exactness() -> None:
    for dtype, bound in ((torch.int32, 2**24), (torch.int64, 2**53)):
        step = Step(index=1, kind="all_reduce", group=0, dtype=dtype, numel=4, op="SUM", root=0, tag=0,
                    is_async=False)
        assert max(abs(int(pg.values(step, sender, 0, 1, 4)[0])) for sender in range(4)) > bound


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_programs_are_seeded_and_cover_every_offered_kind(world_size: int) -> None:
    groups, kinds = pg.program_groups(world_size), pg.possible_kinds(world_size)
    first = pg.draw_program(23, 0, groups, True, kinds)
    assert first == pg.draw_program(23, 0, groups, True, kinds)
    assert first != pg.draw_program(24, 0, groups, True, kinds)
    assert {s.kind for s in first} == set(kinds)  # 16 steps: each kind once before any twice
    for step in first:
        members = groups[step.group]
        assert step.kind not in pg.P2P or len(members) > 1
        assert step.op != "AVG" or (len(members) in (1, 2, 4, 8) and step.dtype.is_floating_point)
        assert step.op not in pg.BITWISE or not step.dtype.is_floating_point
        assert step.reduces or step.op == "SUM"
    assert not [s for s in pg.draw_program(23, 1, groups, False, kinds) if s.tag]
    without = pg.draw_program(23, 0, groups, True, tuple(k for k in kinds if k != "gather"))
    assert "gather" not in {s.kind for s in without}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 8])
def test_partitions_give_every_rank_one_group(world_size: int) -> None:
    for parts in pg.program_partitions(world_size):
        assert sorted(r for part in parts for r in part) == list(range(world_size))


def test_shrinker_keeps_the_failing_step_and_drops_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that fails whenever step #5 runs async after step #2 shrinks to those two (async kept)."""
    steps = [Step(index=i, kind="all_reduce", group=0, dtype=torch.float32, numel=1, op="SUM", root=0, tag=0,
                  is_async=True) for i in range(8)]

    def judge(ctx: Any, candidate: list[Step], *rest: Any) -> program_runs.Outcome:
        indices = [s.index for s in candidate]
        fails = 5 in indices and 2 in indices and next(s for s in candidate if s.index == 5).is_async
        first = indices.index(5) if fails else len(candidate)
        return program_runs.Outcome(["mismatch" if fails else "ok"], first, ["step 5 wrong"] if fails else [])

    monkeypatch.setattr(program_runs, "judge_program", judge)
    outcome = judge(None, steps)
    small, seen = program_runs.shrink(SimpleNamespace(), steps, outcome, [[0]], [None], 0, "t")
    assert [s.index for s in small] == [2, 5] and seen == ["step 5 wrong"]
    assert all(s.is_async for s in small)  # making it sync stopped the failure, so the shrinker kept async


def test_guards_see_a_write_past_the_view_and_an_unwritten_output() -> None:
    buffer = torch.full((4 + 2 * pg.GUARD,), pg.SENTINEL, dtype=torch.int32)
    view = buffer[pg.GUARD:pg.GUARD + 4]
    watched = program_steps.Watched(view, buffer, torch.tensor([1, 2, 3, 4]), "out")
    assert "4 of 4 elements differ" in (watched.problem() or "")
    view.copy_(torch.tensor([1, 2, 3, 4]))
    assert watched.problem() is None
    buffer[pg.GUARD + 4] = 7
    assert "wrote outside the tensor" in (watched.problem() or "")


def test_shapes_join_pieces_along_dim_0() -> None:
    step = Step(index=0, kind="all_gather_into_tensor", group=0, dtype=torch.float32, numel=6, op="SUM", root=0,
                tag=0, is_async=False, shape="3-D")
    assert pg.piece_shape(step, 6) == (2, 1, 3) and pg.joined_shape(step, 4, 6) == (8, 1, 3)
    scalar = Step(index=0, kind="all_gather_into_tensor", group=0, dtype=torch.float32, numel=1, op="SUM", root=0,
                  tag=0, is_async=False, shape="0-d")
    assert pg.piece_shape(scalar, 1) == () and pg.joined_shape(scalar, 3, 1) == (3,)
    assert pg.piece_shape(scalar, 2) == (2,)  # 0-d only where the piece is one element


class _Polled:
    """A Work whose is_completed() turns True after ``after`` calls (never, when None)."""

    def __init__(self, after: int | None) -> None:
        self.after, self.calls = after, 0

    def is_completed(self) -> bool:
        self.calls += 1
        return self.after is not None and self.calls > self.after


def test_a_polled_step_waits_for_is_completed_and_fails_naming_it_when_it_never_comes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx: Any = SimpleNamespace(rank=1, poll_failed=False, target=SimpleNamespace(traits=SimpleNamespace(
        p2p_wait_timeout_s=None)))
    late = _Polled(after=3)
    assert program_steps._poll(ctx, [late], "step #2", python_group=False) == []
    assert late.calls == 4 and not ctx.poll_failed
    monkeypatch.setattr(program_steps, "POLL_S", 0.05)
    never = _Polled(after=None)
    never.wait = lambda: True  # type: ignore[attr-defined]
    problems = program_steps._poll(ctx, [never], "step #2", python_group=False)
    assert problems and "is_completed() still False" in problems[0] and ctx.poll_failed
