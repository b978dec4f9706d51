"""Fault injection for reliability tests: a rank that crashes, hangs or is slow at a chosen op.

Set ``SIM_FAULT=<rank>:<op>:<kind>`` in the rank processes' environment (read once, when the simulator
is registered: ``arm``) or call ``plant``,
where kind is one of raise, exit, sigkill, hang, slow and op one of OPS. The fault fires on the
first op named ``op`` (e.g. allreduce, send, barrier) that the given global rank issues, once per
parent process: rank processes started again by the same parent (a rebuilt pool) do not fire it
again. A malformed value is refused with a message naming it (``check_env``).
"""

from __future__ import annotations

import os
import signal
import time
import zlib

from simulator import shm

KINDS = ("raise", "exit", "sigkill", "hang", "slow")
# Ops the backend passes to maybe_inject (the names of its launches); coalesced launches end in _coalesced.
OPS = ("allreduce", "allgather", "allgather_into_tensor", "reduce_scatter_tensor", "broadcast", "reduce",
       "barrier", "all_to_all_single", "send", "recv", "p2p_coalesced", "allreduce_coalesced",
       "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced")
MARKER_PREFIX = "simfault-"
_planted: dict[tuple[int, str], str] = {}
_armed = [""]  # the SIM_FAULT spec read by arm(), until it fires


class InjectedFault(RuntimeError):
    """The exception an injected ``raise`` fault throws."""


def _check(rank: int, op: str, kind: str, where: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"{where}unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
    if op not in OPS:
        raise ValueError(f"{where}unknown op {op!r}; known: {', '.join(OPS)}")
    if rank < 0:
        raise ValueError(f"{where}rank must be >= 0, got {rank}")


def plant(rank: int, op: str, kind: str) -> None:
    """Plant a fault in this process."""
    _check(rank, op, kind, "")
    _planted[(rank, op)] = kind


def clear() -> None:
    """Remove every in-process fault."""
    _planted.clear()


def parse(spec: str) -> tuple[int, str, str] | None:
    """``"<rank>:<op>:<kind>"`` -> (rank, op, kind); "" -> None; anything else a ValueError naming it."""
    if not spec:
        return None
    where = f"SIM_FAULT={spec!r}: "
    parts = spec.split(":")
    if len(parts) != 3 or not parts[0].strip().isdigit():
        raise ValueError(f"{where}expected <rank>:<op>:<kind>, e.g. 1:allreduce:raise")
    rank, op, kind = int(parts[0]), parts[1], parts[2]
    _check(rank, op, kind, where)
    return rank, op, kind


def check_env() -> None:
    """Raise ValueError naming SIM_FAULT when it is set but malformed."""
    parse(os.environ.get("SIM_FAULT", ""))


def _marker(spec: str) -> str:
    """The /dev/shm name that records this spec as fired for this parent process (pid in the name)."""
    return f"{MARKER_PREFIX}{os.getppid()}-{zlib.crc32(spec.encode()):08x}"


def arm() -> None:
    """Take SIM_FAULT from the environment now (``simulator.register`` calls this); a malformed value is refused."""
    spec = os.environ.get("SIM_FAULT", "")
    parse(spec)
    _armed[0] = spec


def _claim_env_fault(rank: int, op: str) -> str | None:
    """The kind of the armed SIM_FAULT for (rank, op) if it has not fired yet under this parent; claims it."""
    spec = _armed[0]
    parsed = parse(spec)
    if parsed is None or parsed[:2] != (rank, op):
        return None
    try:
        os.close(os.open(shm.path(_marker(spec)), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return None  # already fired in an earlier process of this run
    return parsed[2]


def maybe_inject(rank: int, op: str) -> None:
    """Fire the fault planted for (rank, op), once."""
    kind = _planted.pop((rank, op), None) or _claim_env_fault(rank, op)
    if kind is None:
        return
    os.environ.pop("SIM_FAULT", None)
    _armed[0] = ""
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
