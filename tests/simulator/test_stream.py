"""Streams run ops in order on a worker that, once the stream is idle, parks and serves the next stream."""

from __future__ import annotations

import os
import signal
import threading
import time

from simulator import stream as streams
from simulator.stream import Stream


def _thread_of(s: Stream) -> threading.Thread:
    return s.submit(threading.current_thread).wait()


def test_ops_run_in_order_off_the_caller_thread() -> None:
    s, seen = Stream("order"), []
    futs = [s.submit(lambda i=i: seen.append(i)) for i in range(50)]
    for f in futs:
        f.wait()
    assert seen == list(range(50))
    assert _thread_of(s) is not threading.current_thread()
    s.close()


def test_a_closed_streams_worker_serves_the_next_stream() -> None:
    first = Stream("first")
    worker = _thread_of(first)
    first.close()
    second = Stream("second")
    assert _thread_of(second) is worker, "the next stream started a thread instead of taking the parked worker"
    second.close()


def test_busy_streams_get_workers_of_their_own() -> None:
    a, b = Stream("a"), Stream("b")
    release = threading.Event()
    blocked = a.submit(lambda: release.wait(5))
    b_thread = _thread_of(b)
    release.set()
    blocked.wait()
    assert b_thread is not _thread_of(a)
    a.close()
    b.close()


def test_a_forked_child_never_hands_work_to_its_parents_parked_workers() -> None:
    s = Stream("before-fork")
    _thread_of(s)
    s.close()
    deadline = time.monotonic() + 5
    while not streams._parked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert streams._parked, "no worker parked (positive control)"
    pid = os.fork()
    if pid == 0:  # the child: a worker must run this, not a dead parked one
        signal.alarm(10)  # a hang ends the child (the test then fails), never the test run
        try:
            ok = Stream("child").submit(lambda: 7).wait() == 7
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_stream_is_idle_once_its_last_op_completed() -> None:
    """The worker leaves the stream before it completes the last op's future, so closing the stream right
    after waiting on it waits for nothing (every check closes its world's streams at destroy)."""
    s = Stream("idle")
    s.submit(lambda: None).wait()
    assert s._served.is_set(), "the stream still held its worker after its last op completed"
    started = time.monotonic()
    s.close(timeout_s=5.0)
    assert time.monotonic() - started < 0.5


def test_a_worker_keeps_serving_a_stream_with_queued_work() -> None:
    s, release, seen = Stream("busy"), threading.Event(), []
    first = s.submit(lambda: release.wait(5))
    rest = [s.submit(lambda i=i: seen.append((i, threading.current_thread()))) for i in range(3)]
    release.set()
    first.wait()
    for f in rest:
        f.wait()
    assert [i for i, _ in seen] == [0, 1, 2]
    assert len({t for _, t in seen}) == 1, "queued ops of one stream ran on different workers"
    s.close()
