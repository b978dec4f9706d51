"""Simulator work objects: wait() waits (or times out), and the batch_wait_no_wait defect really does not."""

import datetime

import pytest
import torch

from simulator.defects import resolve
from simulator.work import SimWork


def test_wait_times_out_on_an_unfinished_launch_and_returns_once_done() -> None:
    fut = torch.futures.Future()
    work = SimWork(fut)
    with pytest.raises(RuntimeError, match="Timed out waiting 50ms for the work to complete"):
        work.wait(datetime.timedelta(seconds=0.05))
    assert not work.is_completed()
    fut.set_result(None)
    assert work.wait(datetime.timedelta(0)) and work.is_completed() and work.is_success()


def test_wait_reraises_the_launch_error() -> None:
    fut = torch.futures.Future()
    fut.set_exception(ValueError("rank 1 sent float64[4], rank 0 expected float32[4]"))
    with pytest.raises(ValueError, match="rank 1 sent"):
        SimWork(fut).wait()


def test_batch_wait_no_wait_defect_returns_before_p2p_data_arrives() -> None:
    fut = torch.futures.Future()
    planted = resolve(names=["batch_wait_no_wait"]).parts
    assert planted.p2p_work(fut).wait() is True
    with pytest.raises(RuntimeError):
        planted.work(fut).wait(datetime.timedelta(seconds=0.05))  # collectives still wait
    with pytest.raises(RuntimeError):
        resolve().parts.p2p_work(fut).wait(datetime.timedelta(seconds=0.05))  # a backend without the defect waits
    assert not fut.done()


def test_future_and_result_hold_the_output_tensors_as_gloo_does() -> None:
    """DDP's reducer reads element 0 of the future's value (c10d parseCppCommHookResult)."""
    out = torch.zeros(3)
    fut = torch.futures.Future()
    work = SimWork(fut, outputs=[out])
    chained = work.get_future()
    assert not chained.done()
    fut.set_result(None)
    value = chained.wait()
    assert isinstance(value, list) and len(value) == 1 and value[0] is out
    assert work.result()[0] is out
    assert SimWork(torch.futures.Future(), outputs=None).get_future() is not None


def test_future_carries_the_launch_error() -> None:
    fut = torch.futures.Future()
    work = SimWork(fut, outputs=[torch.zeros(1)])
    fut.set_exception(ValueError("rank 1: all_reduce mismatch"))
    with pytest.raises(RuntimeError, match="rank 1: all_reduce mismatch"):  # torch wraps a callback's error
        work.get_future().wait()
