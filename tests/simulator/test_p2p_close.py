"""A sender's close waits for its messages to be taken, but not on a receiver that has already left."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from simulator.control import ControlPlane
from simulator.p2p import P2PPlane


def _pair(timeout_s: float) -> tuple[dist.Store, Callable[[int], P2PPlane]]:
    """The store (kept alive by the caller) and a maker of rank ``r``'s P2P plane of a 2-rank communicator."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def plane(rank: int) -> P2PPlane:
        return P2PPlane(ControlPlane(dist.PrefixStore("comm/c0/", server), "c0", [0, 1], rank, timeout_s))
    return server, plane


def _closing_time(plane: P2PPlane) -> float:
    started = time.monotonic()
    plane.close()
    plane._ctl.close()
    return time.monotonic() - started


def test_close_does_not_wait_on_a_receiver_that_left_after_taking_the_message() -> None:
    """Rank 1 sends before rank 0's side of the communicator exists (so it never opened rank 0's mailbox); rank 0
    then takes the message and leaves. Rank 1's close must not wait out its grace for a receiver that is gone
    (it waited the whole grace, 10 s, in P2P-LAZY-PAIR-COMM at world 4, about one run in four)."""
    _, plane = _pair(timeout_s=4.0)
    sender = plane(1)
    sender.send(torch.arange(4.0), 0, tag=0)
    receiver = plane(0)
    got = torch.zeros(4)
    assert receiver.recv(got, 1, tag=0) == 1 and got.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert _closing_time(receiver) < 1.0
    assert _closing_time(sender) < 1.0


def test_close_waits_its_grace_for_a_receiver_that_is_still_there() -> None:
    """The positive control: a live receiver that has not taken the message yet is waited for, up to the grace
    (here the communicator's timeout, 0.6 s)."""
    _, plane = _pair(timeout_s=0.6)
    receiver, sender = plane(0), plane(1)
    sender.send(torch.arange(4.0), 0, tag=0)
    assert _closing_time(sender) >= 0.55
    assert _closing_time(receiver) < 1.0
