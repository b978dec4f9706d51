"""The P2P plane: envelopes on ordered channels, tensor bytes in one segment per message.

Per ordered channel (src, dst), envelope k (a :class:`simulator.wire.Envelope`) sits under its own
key, read and deleted by the receiver; each message gets its own segment, a memfd with no name in
/dev/shm (``simulator.shm.Handoff``) that the receiver opens through the sender's /proc fd and marks
taken, so no message's bytes outlive the sending process, however it ends. Receives match the
oldest pending envelope with the wanted tag, in arrival order.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import threading
import time
from collections.abc import Sequence

import torch.distributed as dist
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
        self._poppers: set[int] = set()
        self._outbox: list[shm.Handoff] = []  # sent messages whose receiver has not taken them yet
        self.rendezvous_bytes = rendezvous.threshold_bytes()

    def send(self, tensor: Tensor, dst: int, tag: int) -> None:
        """Send: returns once the data sits in shared memory and the envelope is posted, and, for a
        rendezvous-sized message (see simulator.rendezvous), once the receiver has posted its recv."""
        ctl = self._ctl
        if ctl.closed:
            raise SimError(f"{ctl.where()}: send on rank {ctl.g(ctl.me)} after close()")
        st = ctl.store()
        err_key = rejected_key(ctl.me, dst)
        if st.check([err_key]):  # reported, not raised: refusing this send would hang its matching recv
            report = st.get(err_key).decode()
            st.delete_key(err_key)
            LOG.warn(f"{ctl.where()}: an earlier send from rank {ctl.g(ctl.me)} to rank {ctl.g(dst)} "
                     f"was rejected by the receiver: {report}", RuntimeWarning)
        with self._lock:
            k = self._sent[dst]
            self._sent[dst] += 1
            self._release_taken()
        name = None
        if tensor.numel():
            segment = shm.Handoff(nbytes(tensor))
            with self._lock:
                self._outbox.append(segment)
            typed(segment.data, 0, tensor.dtype, tensor.numel()).view(tensor.shape).copy_(tensor)
            name = segment.ref
        envelope = Envelope(k, tag, dtype_name(tensor.dtype), list(tensor.shape), name)
        st.set(envelope_key(ctl.me, dst, k), envelope.encode())
        if self.rendezvous_bytes is not None and nbytes(tensor) >= self.rendezvous_bytes:
            try:
                rendezvous.wait_posted(st, me=ctl.me, dst=dst, k=k, timeout_s=ctl.timeout_s,
                                       what=f"send #{k} of {tdesc(tensor)} (tag {tag})",
                                       names=(f"rank {ctl.g(ctl.me)}", f"rank {ctl.g(dst)}"),
                                       where=ctl.where())
            except rendezvous.P2PDeadlock as exc:  # hung on NCCL: the communicator is unusable
                ctl.broken = str(exc)
                raise

    def post_receive(self, src: int | None) -> None:
        """Record, when the application issues it, a receive from local rank ``src`` (None: any)."""
        if self.rendezvous_bytes is not None:
            rendezvous.post_receive(self._ctl.store(), src, self._ctl.me)

    def recv(self, tensor: Tensor, src: int | None, tag: int) -> int:
        """Receive the oldest message with ``tag`` from ``src`` (any member if None); return its local src."""
        ctl = self._ctl
        if ctl.closed:
            raise SimError(f"{ctl.where()}: recv on rank {ctl.g(ctl.me)} after close()")
        srcs = list(range(ctl.n)) if src is None else [src]
        deadline = time.monotonic() + ctl.timeout_s
        delay = 5e-5
        blocked = False
        try:
            while True:
                hit = self._take(srcs, tag)
                if hit is not None:
                    return self._consume(tensor, hit[0], hit[1], tag)
                if not blocked and self.rendezvous_bytes is not None:  # peers' deadlock reports name it
                    who = "any rank" if src is None else f"rank {ctl.g(src)}"
                    ctl.store().set(rendezvous.blocked_key(ctl.me), f"recv of {tdesc(tensor)} (tag {tag}) from {who}")
                    blocked = True
                arrived = self._wait_message(srcs, src, tag, deadline, delay)
                delay = 5e-5 if arrived else min(2 * delay, _POLL_MAX_S)
        except RankTimeout:
            blocked = False  # the key stays: the peer's own report names this receive
            raise
        finally:
            if blocked:
                ctl.store().delete_key(rendezvous.blocked_key(ctl.me))

    def _wait_message(self, srcs: list[int], src: int | None, tag: int, deadline: float, delay: float) -> bool:
        """Wait (at most until ``deadline``) for an envelope from ``srcs``; True if one may have arrived."""
        ctl = self._ctl
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            who = "any rank" if src is None else f"rank {ctl.g(src)}"
            nxt = "" if src is None else f" (seq: message #{self._recvd[src]} on that channel)"
            peer = ""
            if src is not None and self.rendezvous_bytes is not None:
                peer = f"; rank {ctl.g(src)} {rendezvous.peer_state(ctl.store(), src)}"
            raise RankTimeout(f"{ctl.where()}: " + timeouts.message(
                f"recv(tag={tag}) on rank {ctl.g(ctl.me)}", ctl.timeout_s,
                f"no matching message from {who}{nxt}{peer}"))
        if src is not None and self._claim(src):
            try:
                self._pop(src, remaining)
            finally:
                with self._lock:
                    self._poppers.discard(src)
            return True
        if any(self._try_pop(j) for j in srcs):
            return True
        time.sleep(min(delay, remaining))
        return False

    def _try_pop(self, src: int) -> bool:
        """Pop channel src -> me without blocking, unless another thread is popping it."""
        if not self._claim(src):
            return False
        try:
            return self._pop(src, None)
        finally:
            with self._lock:
                self._poppers.discard(src)

    def _claim(self, src: int) -> bool:
        """Become the only thread popping channel src -> me."""
        with self._lock:
            if src in self._poppers:
                return False
            self._poppers.add(src)
            return True

    def _pop(self, src: int, timeout: float | None) -> bool:
        """Move the next envelope of channel src -> me to the pending list; block up to ``timeout`` if given.

        The caller has claimed the channel: envelope k of a channel sits under its own key, which only
        this thread reads and deletes.
        """
        st = self._ctl.store()
        key = envelope_key(src, self._ctl.me, self._popped[src])
        if timeout is None:
            if not st.check([key]):
                return False
        else:
            try:
                st.wait([key], datetime.timedelta(seconds=max(timeout, 1e-3)))
            except dist.DistStoreError:
                return False
        raw = st.get(key)
        st.delete_key(key)
        with self._lock:
            self._popped[src] += 1
            self._pending[src].append((self._arrivals, Envelope.decode(raw)))
            self._arrivals += 1
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
            report = (f"{ctl.where()}: recv(tag={tag}) on rank {ctl.g(ctl.me)} matched message "
                      f"#{env.number} from rank {ctl.g(src)}: expected {tdesc(tensor)} (receive buffer), "
                      f"observed {env.describe()} (sent by rank {ctl.g(src)})")
            ctl.store().set(rejected_key(src, ctl.me), report)
            raise P2PMismatch(report)
        if name is not None:
            try:
                buf, head = shm.open_handoff(name)
            except FileNotFoundError:
                raise SimError(f"{ctl.where()}: recv(tag={tag}) on rank {ctl.g(ctl.me)}: message "
                               f"#{env.number} from rank {ctl.g(src)} was dropped (sender closed)") from None
            tensor.copy_(typed(buf, 0, dtype, tensor.numel()).view(tensor.shape))
            shm.mark_taken(head)
        return src

    def _release_taken(self) -> None:
        """Close the segments of sent messages their receivers have taken (the caller holds the lock)."""
        for segment in [s for s in self._outbox if s.taken()]:
            segment.close()
        self._outbox = [s for s in self._outbox if s.fd >= 0]

    def close(self) -> None:
        """Give sends not yet received a grace period of min(timeout_s, 10 s) to be picked up (none on a
        broken communicator), then close the segments of those still unreceived (dropped)."""
        deadline = time.monotonic() + (0.0 if self._ctl.broken else min(self._ctl.timeout_s, _CLOSE_GRACE_S))
        delay = 1e-4
        while True:
            with self._lock:
                self._release_taken()
                unreceived = list(self._outbox)
            if not unreceived or time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
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
            if hit is None and plane._try_pop(src):
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
