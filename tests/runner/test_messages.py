"""The pool's pipe messages are typed records that cross the pipe intact; a rank status is one of five."""

import pickle

import pytest

from conformance.runner.messages import RankStatus, RunTask, TaskDone
from conformance.runner.pool import RankReport
from conformance.runner.worker import dumps


def test_messages_cross_the_pipe_as_themselves() -> None:
    task = RunTask(7, "tests.runner.tasks:echo", {"n": 1})
    done = TaskDone(7, RankStatus.OK, {"rank": 0}, "", "", 0.25)
    assert pickle.loads(dumps(task)) == task
    back = pickle.loads(dumps(done))
    assert back == done and back.status is RankStatus.OK


def test_a_misspelt_status_is_refused_where_it_is_made() -> None:
    assert RankReport(0, "timeout").status is RankStatus.TIMEOUT
    with pytest.raises(ValueError, match="'timedout' is not a valid RankStatus"):
        RankReport(0, "timedout")


def test_each_status_says_how_the_rank_ended() -> None:
    assert [s.verb for s in RankStatus] == ["returned", "raised", "crashed", "timed out",
                                            "was abandoned after a peer failed"]
