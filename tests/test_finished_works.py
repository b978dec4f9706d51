"""API-LIFECYCLE's finished Works: after their group is destroyed, a finished Work must still say it completed,
without an error, and keep its tensor; anything else fails naming the rank, the op and what was seen."""

from __future__ import annotations

import pytest
import torch

from conformance.checks.finished_works import Finished, expect_kept
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

WANT = [1.0, 2.0, 3.0]


class FakeWork:
    """A Work whose answers are set by the test."""

    def __init__(self, completed: bool = True, error: Exception | None = None, success: object = True) -> None:
        self.completed, self.error, self.success = completed, error, success

    def is_completed(self) -> bool:
        return self.completed

    def exception(self) -> Exception | None:
        return self.error

    def is_success(self) -> bool:
        if isinstance(self.success, Exception):
            raise self.success
        return bool(self.success)


def _ctx() -> CheckContext:
    return CheckContext(rank=1, world_size=2, target=None, store=None, requirement=None, timeout_s=1.0)


def _finished(work: FakeWork, values: list[float] = WANT) -> list[Finished]:
    return [Finished("a subgroup: irecv from rank 0", work, torch.tensor(values), WANT)]


def test_a_finished_work_that_kept_its_state_passes() -> None:
    expect_kept(_ctx(), _finished(FakeWork()))


def test_nccls_deprecated_is_success_is_noted_not_failed() -> None:
    ctx = _ctx()
    expect_kept(ctx, _finished(FakeWork(success=NotImplementedError("WorkNCCL::isSuccess() is deprecated"))))
    assert any("deprecated" in note for note in ctx.notes)


@pytest.mark.parametrize(("work", "values", "named"), [
    (FakeWork(error=RuntimeError("group destroyed")), WANT, "work.exception() after its group was destroyed"),
    (FakeWork(completed=False), WANT, "work.is_completed() after its group was destroyed"),
    (FakeWork(success=False), WANT, "work.is_success() after its group was destroyed"),
    (FakeWork(), [1.0, 2.0, -1.0], "its tensor after its group was destroyed"),
])
def test_a_changed_state_fails_naming_the_rank_the_op_and_what_changed(work: FakeWork, values: list[float],
                                                                       named: str) -> None:
    with pytest.raises(CheckFailed) as failed:
        expect_kept(_ctx(), _finished(work, values))
    assert str(failed.value).startswith(f"rank 1: a subgroup: irecv from rank 0: {named}: expected ")
