"""Streams: ordered executors that complete torch futures.

Ops submitted to one stream run one after another on a thread (like a CUDA stream). A stream holds
a worker thread only while it has work: the worker that finds the queue empty after an op leaves
the stream and parks before it completes that op's future, so that whoever waited on it finds the
stream idle (closing it waits for nothing) and its worker ready for the next stream that gets work
(often a new communicator's: every check makes a world), without a thread start. A worker parked
for ``_PARK_S`` exits. Store connections go back to the shared idle list as soon as a stream's
queue is empty.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from simulator import connections

_PARK_S = 10.0  # a worker without a stream exits after waiting this long for one
THREAD_PREFIX = "sim-stream-"  # every worker's name starts so: then the stream it serves, or "parked"
PARKED_THREAD_NAME = f"{THREAD_PREFIX}parked"

_Item = tuple[Callable[[], Any], torch.futures.Future]
_park_lock = threading.Lock()
_parked: list[queue.SimpleQueue[Stream]] = []  # the inboxes of parked workers


def _forget_parked() -> None:
    """In a forked child the parked workers do not exist: never hand them a stream."""
    global _park_lock
    _park_lock = threading.Lock()
    _parked.clear()


os.register_at_fork(after_in_child=_forget_parked)


def _dispatch(stream: Stream) -> None:
    """Give ``stream`` to a parked worker, or to a new one."""
    with _park_lock:
        inbox = _parked.pop() if _parked else None
    if inbox is not None:
        inbox.put(stream)
    else:
        threading.Thread(target=_work, args=(stream,), name=f"{THREAD_PREFIX}{stream.name}", daemon=True).start()


def _park_inbox() -> queue.SimpleQueue[Stream]:
    """Register a parked worker's inbox: streams dispatched from now on may go to it."""
    inbox: queue.SimpleQueue[Stream] = queue.SimpleQueue()
    with _park_lock:
        _parked.append(inbox)
    return inbox


def _park(inbox: queue.SimpleQueue[Stream]) -> Stream | None:
    """Wait (bounded) on a registered ``inbox`` for the next stream; None when none came and this worker
    should exit."""
    try:
        return inbox.get(timeout=_PARK_S)
    except queue.Empty:
        with _park_lock:
            if inbox in _parked:
                _parked.remove(inbox)
                return None
        return inbox.get()  # a dispatcher took this inbox just now: its stream is on the way


def _work(stream: Stream | None) -> None:
    """A worker: serve streams one at a time, parking between them."""
    try:
        while stream is not None:
            threading.current_thread().name = f"{THREAD_PREFIX}{stream.name}"
            inbox = stream._serve()
            threading.current_thread().name = PARKED_THREAD_NAME
            stream = _park(inbox)
    finally:
        connections.release_thread()


class Stream:
    """An ordered executor for one simulated stream."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._served = threading.Event()  # set while no worker serves this stream
        self._served.set()

    def submit(self, fn: Callable[[], Any]) -> torch.futures.Future:
        """Queue ``fn``; the returned future completes with its result or exception."""
        fut: torch.futures.Future = torch.futures.Future()
        with self._lock:
            self._queue.put((fn, fut))
            if self._served.is_set():
                self._served.clear()
                _dispatch(self)
        return fut

    def _serve(self) -> queue.SimpleQueue[Stream]:
        """Run queued ops until the queue is empty; then leave the stream, park (return the inbox), and
        only then complete the last op's future."""
        while True:
            fn, fut = self._queue.get()  # never blocks long: a worker serves a stream only while it has work
            try:
                result, error = fn(), None
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiter
                result, error = None, exc
            inbox = None
            with self._lock:
                if self._queue.empty():
                    connections.release_thread()
                    self._served.set()
                    inbox = _park_inbox()
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
            del fn, fut, result, error  # a parked worker keeps no reference to the op or its outcome
            if inbox is not None:
                return inbox

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for queued ops to finish and their worker to leave the stream."""
        self._served.wait(timeout=timeout_s)
