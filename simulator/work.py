"""Work objects: wait() blocks until the stream has finished the launch.

A Work's future completes with the op's output tensors, as torch's own backends complete theirs
(ProcessGroupGloo's returnFutureWithOutput: a list of the output tensors; an empty list for ops
without outputs). DDP's reducer reads element 0 of that value without a bounds check
(c10d::detail::parseCppCommHookResult), so a future holding None crashes the process.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from simulator import timeouts


def _outputs_of(done: torch.futures.Future, outputs: list[Any]) -> list[Any]:
    done.value()  # re-raises the launch's error into the result future
    return outputs


class SimWork(dist.Work):
    """A launch in flight on a simulator stream.

    ``future`` completes when the launch has run (its value is the launch's own return value);
    ``outputs`` are the tensors the op writes, which the Work's future (``get_future``) holds.
    """

    def __init__(self, future: torch.futures.Future, source_rank: int = -1, *,
                 outputs: list[Any] | None = None) -> None:
        super().__init__()
        self._future = future
        self._source = source_rank
        self._outputs = list(outputs or [])
        self._result: torch.futures.Future | None = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until every op of the launch has completed (at most ``timeout``, if one is given and
        non-zero); re-raise its error."""
        if timeout is not None and timeout.total_seconds() > 0:
            deadline = time.monotonic() + timeout.total_seconds()
            while not self._future.done():
                if time.monotonic() > deadline:
                    raise RuntimeError(timeouts.message("the work to complete", timeout.total_seconds(),
                                                        "its launch is still running on the simulator's stream"))
                time.sleep(0.0005)
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        """True once the launch has finished (successfully or not)."""
        return self._future.done()

    def is_success(self) -> bool:
        """True once the launch has finished without error."""
        return self._future.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The launch's error once it has failed (c10d's Work::exception), else None."""
        if not self._future.done():
            return None
        try:
            self._future.value()
        except Exception as exc:  # noqa: BLE001 - whatever the launch raised is the Work's error
            return exc
        return None

    def get_future(self) -> torch.futures.Future:
        """A future that completes with the op's output tensors (a list), or with its error."""
        if self._result is None:
            outputs = self._outputs
            self._result = self._future.then(lambda done: _outputs_of(done, outputs))
        return self._result

    def result(self) -> list[Any]:
        """The op's output tensors (after waiting), as torch's backends return them."""
        self.wait()
        return list(self._outputs)

    def _source_rank(self) -> int:
        self._future.wait()
        value: Any = self._future.value()
        return value if isinstance(value, int) else self._source

    def source_rank(self) -> int:
        """The group rank a recv(src=None) matched."""
        return self._source_rank()
