"""Rendezvous sends: a send completes only once its receiver has posted the matching receive.

NCCL moves a message larger than its channel buffers only while the receiver takes part, so a
send issued before the peer's receive blocks the sender's stream; two ranks that both send first
hang forever (NCCL_BUFFSIZE, 4 MiB by default, is the buffer per channel). Buffered sends would let
that deadlock pass on CPU, so sends of at least ``threshold_bytes()`` wait for the receive to be
*posted* (the application issued it: a queued irecv counts, as in an NCCL group; the receiver's counts
of posted receives are words of its mailbox, :mod:`simulator.mailbox`), and a send that
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

from simulator import timeouts
from simulator.control import ControlPlane
from simulator.errors import SimError
from simulator.mailbox import Mailbox

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


def peer_state(box: Mailbox | None) -> str:
    """What the owner of ``box`` (a peer's mailbox; None: not reachable yet) says it is blocked in, or that it is
    blocked in nothing the simulator sees."""
    blocked = None if box is None else box.blocked()
    if blocked:
        return f"is blocked in {blocked}"
    return "is not blocked in a send or receive on this communicator (busy elsewhere, or exited)"


def wait_posted(ctl: ControlPlane, *, dst: int, k: int, what: str, names: tuple[str, str]) -> None:
    """Block until ``dst`` has posted receive number ``k + 1`` from this rank, else raise P2PDeadlock.

    ``what`` describes this send; ``names`` are the global names of (this rank, dst) for messages. The
    receiver's counts of posted receives are in its mailbox, and it rings this rank's bell as it posts.
    """
    def posted() -> int:
        box = ctl.peer(dst)
        return 0 if box is None else box.receives_posted(ctl.me) + box.receives_posted(None)

    if posted() > k:
        return
    own = ctl.mailbox
    assert own is not None
    own.set_blocked(f"{what} to {names[1]}")
    if not ctl.wait_until(lambda: posted() > k, time.monotonic() + ctl.timeout_s):
        # what this rank is blocked in stays posted: the peer's own report names this send
        raise P2PDeadlock(f"{ctl.where()}: {names[0]}: " + timeouts.message(
            f"{what} to {names[1]} to complete", ctl.timeout_s,
            f"rendezvous send (>= {threshold_bytes()} bytes: it completes only once the receiver posts "
            f"its recv; {ENV}) and {names[1]} has posted {posted()} receive(s) from {names[0]}, "
            f"this is #{k + 1}; {names[1]} {peer_state(ctl.peer(dst))}. A send issued before the matching "
            f"recv hangs on NCCL: post the recv first, or issue both in one batch_isend_irecv"))
    own.set_blocked(None)
