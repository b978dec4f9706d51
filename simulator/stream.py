"""Streams: ordered executors that complete torch futures.

Ops submitted to one stream run one after another on a thread of their own (like a CUDA stream).
The thread exits once the stream has been idle for a moment and is started again on the next
submit, so that idle communicators hold no thread; its store connections go back to the shared
idle list as soon as its queue is empty.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from simulator import connections

_IDLE_EXIT_S = 0.05


class Stream:
    """An ordered executor for one simulated stream."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], torch.futures.Future] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], Any]) -> torch.futures.Future:
        """Queue ``fn``; the returned future completes with its result or exception."""
        fut: torch.futures.Future = torch.futures.Future()
        with self._lock:
            self._queue.put((fn, fut))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"sim-stream-{self.name}", daemon=True)
                self._thread.start()
        return fut

    def _loop(self) -> None:
        try:
            while True:
                try:
                    item = self._queue.get(timeout=_IDLE_EXIT_S)
                except queue.Empty:
                    item = None
                if item is None:  # idle, or close() asked us to stop once the queue is drained
                    with self._lock:
                        if self._queue.empty():
                            self._thread = None
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
        finally:
            connections.release_thread()

    def _idle_release(self) -> None:
        """Hand this thread's store connections back once nothing else is queued, before the
        waiter wakes: the next op, often on another communicator's stream, then reuses them
        instead of opening a connection (a connect can stall for seconds on some hosts)."""
        if self._queue.empty():
            connections.release_thread()

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for queued ops to finish; the thread then stops without idling."""
        with self._lock:
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout=timeout_s)
