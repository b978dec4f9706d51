"""Rendezvous sends: a send completes only once its receiver has posted the matching receive.

NCCL moves a message larger than its channel buffers only while the receiver takes part, so a
send issued before the peer's receive blocks the sender's stream; two ranks that both send first
hang forever (NCCL_BUFFSIZE, 4 MiB by default, is the buffer per channel). Buffered sends would let
that deadlock pass on CPU, so sends of at least ``threshold_bytes()`` wait for the receive to be
*posted* (the application issued it: a queued irecv counts, as in an NCCL group), and a send that
waits past the group's timeout raises :class:`P2PDeadlock` naming both ranks and what each is
blocked in.

``SIM_P2P_RENDEZVOUS_BYTES``: the size from which sends rendezvous (default 4194304, NCCL's
default buffer size); ``0`` makes every send rendezvous, ``off`` turns the mode off (every send
buffered). Smaller sends stay buffered by default because NCCL usually completes them eagerly.
A receive from any source counts as posted for every sender (a documented approximation).
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist

from simulator import timeouts
from simulator.errors import SimError

DEFAULT_BYTES = 4 << 20
ENV = "SIM_P2P_RENDEZVOUS_BYTES"
_POLL_MAX_S = 5e-3


class P2PDeadlock(SimError):
    """A rendezvous send whose receive was never posted: names both ranks and both ops."""


def threshold_bytes() -> int | None:
    """Sends of at least this many bytes rendezvous; None: every send is buffered."""
    raw = os.environ.get(ENV, "").strip().lower()
    if not raw:
        return DEFAULT_BYTES
    if raw in ("off", "none", "never"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"simulator: {ENV}={raw!r}: expected a byte count or 'off'") from None
    if value < 0:
        raise ValueError(f"simulator: {ENV}={raw!r}: expected a byte count >= 0 or 'off'")
    return value


def posted_key(src: int, dst: int) -> str:
    """Counter of receives rank ``dst`` has posted for messages from ``src`` (local ranks)."""
    return f"pr/{src}>{dst}"


def any_key(dst: int) -> str:
    """Counter of any-source receives rank ``dst`` has posted."""
    return f"pr/*>{dst}"


def blocked_key(rank: int) -> str:
    """What rank ``rank`` is blocked in right now (set while it waits on a peer)."""
    return f"blocked/{rank}"


def post_receive(store: dist.Store, src: int | None, me: int) -> None:
    """Record that this rank has issued a receive from ``src`` (None: any source)."""
    store.add(any_key(me) if src is None else posted_key(src, me), 1)


def peer_state(store: dist.Store, peer: int) -> str:
    """What ``peer`` says it is blocked in, or that it is blocked in nothing the simulator sees."""
    key = blocked_key(peer)
    if store.check([key]):
        return f"is blocked in {store.get(key).decode()}"
    return "is not blocked in a send or receive on this communicator (busy elsewhere, or exited)"


def wait_posted(store: dist.Store, *, me: int, dst: int, k: int, timeout_s: float, what: str,
                names: tuple[str, str], where: str) -> None:
    """Block until ``dst`` has posted receive number ``k + 1`` from this rank, else raise P2PDeadlock.

    ``what`` describes this send; ``names`` are the global names of (this rank, dst) for messages.
    """
    def posted() -> int:
        return store.add(posted_key(me, dst), 0) + store.add(any_key(dst), 0)

    if posted() > k:
        return
    store.set(blocked_key(me), f"{what} to {names[1]}")
    deadline = time.monotonic() + timeout_s
    delay = 1e-4
    while posted() <= k:
        if time.monotonic() >= deadline:  # the key stays: the peer's own report names this send
            raise P2PDeadlock(f"{where}: {names[0]}: " + timeouts.message(
                f"{what} to {names[1]} to complete", timeout_s,
                f"rendezvous send (>= {threshold_bytes()} bytes: it completes only once the receiver posts "
                f"its recv; {ENV}) and {names[1]} has posted {posted()} receive(s) from {names[0]}, "
                f"this is #{k + 1}; {names[1]} {peer_state(store, dst)}. A send issued before the matching "
                f"recv hangs on NCCL: post the recv first, or issue both in one batch_isend_irecv"))
        time.sleep(delay)
        delay = min(2 * delay, _POLL_MAX_S)
    store.delete_key(blocked_key(me))
