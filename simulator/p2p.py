"""The P2P plane: envelopes on ordered channels, tensor bytes in one segment per message.

Per ordered channel (src, dst), envelope k (a :class:`simulator.wire.Envelope`) sits in slot k of the
channel's ring in the sender's mailbox (:mod:`simulator.mailbox`; under its own store key only when it
does not fit, or its slot still holds an envelope the receiver has not taken), published by the
sender's count of envelopes sent, which the receiver reads; the sender rings the receiver's bell, and
the receiver counts what it has taken in its own mailbox. Each message's bytes get their own segment,
a memfd with no name in /dev/shm (``simulator.shm.Handoff``) that the receiver opens through the
sender's /proc fd and marks taken, so no message's bytes outlive the sending process, however it ends.
Receives match the oldest pending envelope with the wanted tag, in arrival order.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Sequence

from torch import Tensor

from simulator import rendezvous, shm, timeouts
from simulator.control import ControlPlane
from simulator.dtypes import dtype_from_name
from simulator.errors import P2PMismatch, RankTimeout, SimError
from simulator.events import LOG
from simulator.payload import nbytes, tdesc, typed
from simulator.reduction import dtype_name
from simulator.wire import Envelope, envelope_key, rejected_key

_POLL_MAX_S = 1e-3
_CLOSE_GRACE_S = 10.0


class P2PPlane:
    """Send and receive of one communicator on one rank; threads serving different peers may use it
    concurrently."""

    def __init__(self, control: ControlPlane) -> None:
        self._ctl = control
        n = control.n
        self._lock = threading.Lock()
        self._sent = [0] * n
        self._recvd = [0] * n
        self._popped = [0] * n
        self._pending: list[list[tuple[int, Envelope]]] = [[] for _ in range(n)]
        self._arrivals = 0
        self._rejections = [0] * n  # rejections of this rank's sends each peer has reported, as seen here
        self._outbox: list[shm.Handoff] = []  # sent messages whose receiver has not taken them yet
        self.rendezvous_bytes = rendezvous.threshold_bytes()

    def send(self, tensor: Tensor, dst: int, tag: int) -> None:
        """Send: returns once the data sits in shared memory and the envelope is posted, and, for a
        rendezvous-sized message (see simulator.rendezvous), once the receiver has posted its recv."""
        ctl = self._ctl
        if ctl.closed:
            raise SimError(f"{ctl.where()}: send on rank {ctl.g(ctl.me)} after close()")
        peer = ctl.peer(dst)
        if peer is not None and peer.rejected(ctl.me) > self._rejections[dst]:
            # reported, not raised: refusing this send would hang its matching recv
            self._rejections[dst] = peer.rejected(ctl.me)
            st = ctl.store()
            report = st.get(rejected_key(ctl.me, dst)).decode()
            LOG.warn(f"{ctl.where()}: an earlier send from rank {ctl.g(ctl.me)} to rank {ctl.g(dst)} "
                     f"was rejected by the receiver: {report}", RuntimeWarning)
        name = None
        segment = None
        if tensor.numel():
            segment = shm.Handoff(nbytes(tensor))
            typed(segment.data, 0, tensor.dtype, tensor.numel()).view(tensor.shape).copy_(tensor)
            name = segment.ref
        own = ctl.mailbox
        assert own is not None
        with self._lock:  # envelopes of one channel are published in their order
            self._release_taken()
            if segment is not None:
                self._outbox.append(segment)
            k = self._sent[dst]
            self._sent[dst] += 1
            body = Envelope(k, tag, dtype_name(tensor.dtype), list(tensor.shape), name).encode()
            if not own.put_envelope(dst, k, body.encode(), 0 if peer is None else peer.taken(ctl.me)):
                ctl.store().set(envelope_key(ctl.me, dst, k), body)
            own.mark_sent(dst, k + 1)
        ctl.ring(dst)
        if self.rendezvous_bytes is not None and nbytes(tensor) >= self.rendezvous_bytes:
            try:
                rendezvous.wait_posted(ctl, dst=dst, k=k, what=f"send #{k} of {tdesc(tensor)} (tag {tag})",
                                       names=(f"rank {ctl.g(ctl.me)}", f"rank {ctl.g(dst)}"))
            except rendezvous.P2PDeadlock as exc:  # hung on NCCL: the communicator is unusable
                ctl.broken = str(exc)
                raise

    def post_receive(self, src: int | None) -> None:
        """Record, when the application issues it, a receive from local rank ``src`` (None: any), and wake the
        sender(s) a rendezvous send may have blocked."""
        if self.rendezvous_bytes is None:
            return
        ctl = self._ctl
        own = ctl.mailbox
        assert own is not None
        with self._lock:
            own.add_receive_posted(src)
        if src is not None:
            ctl.ring(src)
            return
        for j in range(ctl.n):  # any source: the peers reachable already (no store lookup per receive); another
            if j != ctl.me and ctl.opened(j):  # sender blocked on this rank sees the count within a wait slice
                ctl.ring(j)

    def recv(self, tensor: Tensor, src: int | None, tag: int) -> int:
        """Receive the oldest message with ``tag`` from ``src`` (any member if None); return its local src."""
        ctl = self._ctl
        if ctl.closed:
            raise SimError(f"{ctl.where()}: recv on rank {ctl.g(ctl.me)} after close()")
        srcs = [j for j in range(ctl.n) if j != ctl.me] if src is None else [src]
        hit = self._take(srcs, tag)
        if hit is None:
            hit = self._wait_message(tensor, srcs, src, tag)
        return self._consume(tensor, hit[0], hit[1], tag)

    def _wait_message(self, tensor: Tensor, srcs: list[int], src: int | None, tag: int) -> tuple[int, Envelope]:
        """Sleep on this rank's bell until a matching envelope arrives from ``srcs``, at most the timeout."""
        ctl = self._ctl
        own = ctl.mailbox
        assert own is not None
        who = "any rank" if src is None else f"rank {ctl.g(src)}"
        if self.rendezvous_bytes is not None:  # peers' deadlock reports name it
            own.set_blocked(f"recv of {tdesc(tensor)} (tag {tag}) from {who}")
        found: list[tuple[int, Envelope]] = []

        def arrived() -> bool:
            for j in srcs:
                self._pop(j)
            hit = self._take(srcs, tag)
            if hit is not None:
                found.append(hit)
            return hit is not None

        if not ctl.wait_until(arrived, time.monotonic() + ctl.timeout_s):
            # what this rank is blocked in stays posted: the peer's own report names this receive
            nxt = "" if src is None else f" (seq: message #{self._recvd[src]} on that channel)"
            peer = ""
            if src is not None and self.rendezvous_bytes is not None:
                peer = f"; rank {ctl.g(src)} {rendezvous.peer_state(ctl.peer(src))}"
            raise RankTimeout(f"{ctl.where()}: " + timeouts.message(
                f"recv(tag={tag}) on rank {ctl.g(ctl.me)}", ctl.timeout_s,
                f"no matching message from {who}{nxt}{peer}"))
        if self.rendezvous_bytes is not None:
            own.set_blocked(None)
        return found[0]

    def _pop(self, src: int) -> bool:
        """Move the envelopes ``src`` has posted on channel src -> me to the pending list; False if none."""
        ctl = self._ctl
        box = ctl.peer(src)
        if box is None or box.sent(ctl.me) <= self._popped[src]:
            return False
        with self._lock:
            count = box.sent(ctl.me)
            while self._popped[src] < count:
                k = self._popped[src]
                raw = box.envelope(ctl.me, k)
                if raw is None:  # it went through the store
                    key = envelope_key(src, ctl.me, k)
                    raw = ctl.store().get(key)
                    ctl.store().delete_key(key)
                self._pending[src].append((self._arrivals, Envelope.decode(raw)))
                self._arrivals += 1
                self._popped[src] = k + 1
            own = ctl.mailbox
            assert own is not None
            own.set_taken(src, self._popped[src])
        ctl.ring(src)  # a sender closing waits for its envelopes to be taken
        return True

    def _take(self, srcs: list[int], tag: int) -> tuple[int, Envelope] | None:
        """Remove and return the earliest-arrived pending envelope from ``srcs`` carrying ``tag``."""
        with self._lock:
            best = None
            for j in srcs:
                for pos, (arrival, env) in enumerate(self._pending[j]):
                    if env.tag == tag:
                        if best is None or arrival < best[0]:
                            best = (arrival, j, pos)
                        break
            if best is None:
                return None
            _, j, pos = best
            return j, self._pending[j].pop(pos)[1]

    def _consume(self, tensor: Tensor, src: int, env: Envelope, tag: int) -> int:
        ctl = self._ctl
        with self._lock:
            self._recvd[src] += 1
        dtype, name = dtype_from_name(env.dtype), env.segment
        if dtype != tensor.dtype or math.prod(env.shape) != tensor.numel():
            if name is not None:  # refused: the sender may let it go
                with contextlib.suppress(FileNotFoundError):
                    shm.mark_taken(shm.open_handoff(name)[1])
                ctl.ring(src)
            report = (f"{ctl.where()}: recv(tag={tag}) on rank {ctl.g(ctl.me)} matched message "
                      f"#{env.number} from rank {ctl.g(src)}: expected {tdesc(tensor)} (receive buffer), "
                      f"observed {env.describe()} (sent by rank {ctl.g(src)})")
            ctl.store().set(rejected_key(src, ctl.me), report)  # the report, then the count that announces it
            own = ctl.mailbox
            assert own is not None
            with self._lock:
                own.add_rejected(src)
            raise P2PMismatch(report)
        if name is not None:
            try:
                buf, head = shm.open_handoff(name)
            except FileNotFoundError:
                raise SimError(f"{ctl.where()}: recv(tag={tag}) on rank {ctl.g(ctl.me)}: message "
                               f"#{env.number} from rank {ctl.g(src)} was dropped (sender closed)") from None
            tensor.copy_(typed(buf, 0, dtype, tensor.numel()).view(tensor.shape))
            shm.mark_taken(head)
            ctl.ring(src)  # a sender closing waits for its messages to be taken
        return src

    def _release_taken(self) -> None:
        """Close the segments of sent messages their receivers have taken (the caller holds the lock)."""
        for segment in [s for s in self._outbox if s.taken()]:
            segment.close()
        self._outbox = [s for s in self._outbox if s.fd >= 0]

    def _unreceived(self) -> bool:
        """Whether a message this rank sent is not taken yet: its bytes, or (an empty tensor's) its envelope. A
        receiver whose mailbox was gone before this rank first looked at it takes nothing more (its stand-in
        counts nothing taken; bytes it took have left the outbox all the same): nothing to wait for there."""
        ctl = self._ctl
        with self._lock:
            self._release_taken()
            if self._outbox:
                return True
        for dst, sent in enumerate(self._sent):
            box = ctl.peer(dst) if sent else None
            if sent and (box is None or (not box.gone and box.taken(ctl.me) < sent)):
                return True
        return False

    def close(self) -> None:
        """Give sends not yet received a grace period of min(timeout_s, 10 s) to be picked up (none on a
        broken communicator), then close the segments of those still unreceived (dropped)."""
        grace = 0.0 if self._ctl.broken else min(self._ctl.timeout_s, _CLOSE_GRACE_S)
        if any(self._sent) and grace:
            self._ctl.wait_until(lambda: not self._unreceived(), time.monotonic() + grace)
        with self._lock:
            for segment in self._outbox:
                segment.close()
            self._outbox = []


def recv_any(channels: Sequence[tuple[P2PPlane, int]], tensor: Tensor, tag: int) -> int:
    """Receive the earliest message with ``tag`` on any of ``channels`` ((plane, local src) pairs: a lazy
    group's pair communicators, one per peer); return the index of the channel it came from."""
    if not channels:
        raise ValueError("recv_any needs at least one channel")
    for plane, _ in channels:
        if plane._ctl.closed:
            raise SimError(f"{plane._ctl.where()}: recv on rank {plane._ctl.g(plane._ctl.me)} after close()")
    timeout_s = max(plane._ctl.timeout_s for plane, _ in channels)
    deadline = time.monotonic() + timeout_s
    delay = 5e-5
    while True:
        for i, (plane, src) in enumerate(channels):
            hit = plane._take([src], tag)
            if hit is None and plane._pop(src):
                hit = plane._take([src], tag)
            if hit is not None:
                plane._consume(tensor, hit[0], hit[1], tag)
                return i
        if time.monotonic() >= deadline:
            ctl = channels[0][0]._ctl
            peers = ", ".join(str(plane._ctl.g(src)) for plane, src in channels)
            raise RankTimeout(f"rank {ctl.g(ctl.me)}: " + timeouts.message(
                f"recv(tag={tag}) from any rank", timeout_s, f"no matching message from ranks {peers}"))
        time.sleep(delay)
        delay = min(2 * delay, _POLL_MAX_S)
