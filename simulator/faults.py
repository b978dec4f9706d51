"""Fault injection for reliability tests: a rank that crashes, hangs or is slow at a chosen op.

Set ``SIM_FAULT=<rank>:<op>:<kind>`` in the rank processes' environment (or call ``plant``),
where kind is one of raise, exit, sigkill, hang, slow. The fault fires on the first op named
``op`` (e.g. allreduce, send, barrier) that the given global rank issues.
"""

from __future__ import annotations

import os
import signal
import time

KINDS = ("raise", "exit", "sigkill", "hang", "slow")
_planted: dict[tuple[int, str], str] = {}


class InjectedFault(RuntimeError):
    """The exception an injected ``raise`` fault throws."""


def plant(rank: int, op: str, kind: str) -> None:
    """Plant a fault in this process."""
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; known: {KINDS}")
    _planted[(rank, op)] = kind


def clear() -> None:
    """Remove every in-process fault."""
    _planted.clear()


def _from_env() -> dict[tuple[int, str], str]:
    spec = os.environ.get("SIM_FAULT", "")
    if not spec:
        return {}
    rank, op, kind = spec.split(":")
    if kind not in KINDS:
        raise ValueError(f"SIM_FAULT: unknown fault kind {kind!r}; known: {KINDS}")
    return {(int(rank), op): kind}


def maybe_inject(rank: int, op: str) -> None:
    """Fire the fault planted for (rank, op), once."""
    kind = _planted.pop((rank, op), None) or _from_env().get((rank, op))
    if kind is None:
        return
    os.environ.pop("SIM_FAULT", None)
    if kind == "raise":
        raise InjectedFault(f"injected fault: rank {rank} raised at {op}")
    if kind == "exit":
        os._exit(17)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(3600)
    time.sleep(2.0)
