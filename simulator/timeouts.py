"""Waiting for store keys until a deadline, and timeout messages in torch's backends' wording.

Wording: gloo says ``Timed out waiting 1000ms for recv operation to complete`` (torch 2.13's gloo,
third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78), and torch's own tests, as users' retry logic,
look for `` (Timed out|closed|timeout) `` (v2.13.0 torch/testing/_internal/distributed/distributed_test.py:848).
The simulator's timeouts say ``Timed out waiting <ms>ms for <op>`` and then who did not arrive.

Timing: a FileStore's ``wait`` overshoots (measured on 2.13: 1 s -> 2.0 s, 0.3 s -> 1.1 s) and raises a plain
``RuntimeError("Wait timeout")``, not ``DistStoreError``; so any store that is not a TCPStore is polled with
``check`` until the deadline instead.
"""

from __future__ import annotations

import datetime
import time

import torch.distributed as dist

_POLL_MAX_S = 0.01


def message(what: str, timeout_s: float, detail: str) -> str:
    """``Timed out waiting <ms>ms for <what>: <detail>``, as gloo words a timeout."""
    return f"Timed out waiting {round(timeout_s * 1000)}ms for {what}: {detail}"


def _tcp_backed(store: dist.Store) -> bool:
    return isinstance(getattr(store, "_underlying_non_prefix_store", store), dist.TCPStore)


def wait_keys(store: dist.Store, keys: list[str], timeout_s: float) -> bool:
    """Wait until every key of ``keys`` exists in ``store``, at most ``timeout_s``; False if the time ran out."""
    if _tcp_backed(store):
        try:
            store.wait(keys, datetime.timedelta(seconds=timeout_s))
        except dist.DistStoreError:
            return False
        return True
    deadline = time.monotonic() + timeout_s
    delay = 1e-4
    while not store.check(keys):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(2 * delay, _POLL_MAX_S)
    return True
