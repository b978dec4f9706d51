"""Streams: ordered executors that complete torch futures.

Ops submitted to one stream run one after another on a thread (like a CUDA stream). A stream holds
a worker thread only while it has work: once it has been idle for a moment the worker leaves it and
parks, and the next stream that gets work (often a new communicator's: every check makes a world)
takes a parked worker instead of starting a thread. A worker parked for ``_PARK_S`` exits. Store
connections go back to the shared idle list as soon as a stream's queue is empty.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from simulator import connections

_IDLE_EXIT_S = 0.05  # a worker leaves a stream idle this long
_PARK_S = 10.0  # a worker without a stream exits after waiting this long for one

_Item = tuple[Callable[[], Any], torch.futures.Future] | None
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
        threading.Thread(target=_work, args=(stream,), name=f"sim-stream-{stream.name}", daemon=True).start()


def _park() -> Stream | None:
    """Wait (bounded) for the next stream; None when none came and this worker should exit."""
    inbox: queue.SimpleQueue[Stream] = queue.SimpleQueue()
    with _park_lock:
        _parked.append(inbox)
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
            threading.current_thread().name = f"sim-stream-{stream.name}"
            stream._serve()
            threading.current_thread().name = "sim-stream-parked"
            stream = _park()
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

    def _serve(self) -> None:
        """Run queued ops until the queue has stayed empty for ``_IDLE_EXIT_S`` (or close() asked)."""
        while True:
            try:
                item = self._queue.get(timeout=_IDLE_EXIT_S)
            except queue.Empty:
                item = None
            if item is None:  # idle, or close() asked us to stop once the queue is drained
                with self._lock:
                    if self._queue.empty():
                        connections.release_thread()
                        self._served.set()
                        return
                continue
            fn, fut = item
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiter
                self._idle_release()
                fut.set_exception(exc)
            else:
                self._idle_release()
                fut.set_result(result)

    def _idle_release(self) -> None:
        """Hand this thread's store connections back once nothing else is queued, before the
        waiter wakes: the next op, often on another communicator's stream, then reuses them
        instead of opening a connection (a connect can stall for seconds on some hosts)."""
        if self._queue.empty():
            connections.release_thread()

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for queued ops to finish; the worker then leaves without idling."""
        with self._lock:
            if not self._served.is_set():
                self._queue.put(None)
        self._served.wait(timeout=timeout_s)
