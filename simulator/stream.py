"""Streams: ordered executors, one thread each, that complete torch futures."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch


class Stream:
    """Ops submitted to one stream run one after another on its own thread (like a CUDA stream)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], torch.futures.Future] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._loop, name=f"sim-stream-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> torch.futures.Future:
        """Queue ``fn``; the returned future completes with its result or exception."""
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((fn, fut))
        return fut

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, fut = item
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiter
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def close(self) -> None:
        """Finish queued ops, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout=5)
