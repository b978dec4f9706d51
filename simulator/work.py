"""Work objects: wait() blocks until the stream has finished the launch."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from simulator import defects


class SimWork(dist.Work):
    """A launch in flight on a simulator stream."""

    def __init__(self, future: torch.futures.Future, source_rank: int = -1, *, p2p: bool = False) -> None:
        super().__init__()
        self._future = future
        self._source = source_rank
        self._p2p = p2p

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until every op of the launch has completed (at most ``timeout``, if one is given and
        non-zero); re-raise its error."""
        if self._p2p and defects.active("batch_wait_no_wait"):
            return True
        if timeout is not None and timeout.total_seconds() > 0:
            deadline = time.monotonic() + timeout.total_seconds()
            while not self._future.done():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"simulator: work did not complete within {timeout}")
                time.sleep(0.0005)
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        """True once the launch has finished (successfully or not)."""
        return self._future.done()

    def is_success(self) -> bool:
        """True once the launch has finished without error."""
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - any error means not a success
            return False
        return True

    def get_future(self) -> torch.futures.Future:
        """The underlying future."""
        return self._future

    def _source_rank(self) -> int:
        self._future.wait()
        value = self._future.value()
        return value if isinstance(value, int) else self._source

    def source_rank(self) -> int:
        """The group rank a recv(src=None) matched."""
        return self._source_rank()
