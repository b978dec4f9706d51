"""The control plane of one communicator on one rank: who it is, per-thread store connections, the
mailboxes, and the per-op message exchange.

Per op, ranks talk through their mailboxes in shared memory (:mod:`simulator.mailbox`) and wake each other
with futexes; the store carries only the bootstrap: each rank posts its mailbox's reference when it creates
the communicator, in the record of the rendezvous that creates it where there is one (a group's boot, a
split: :class:`Boot`), else under a key of its own that peers read once, when they first need it (plus the
rare message too large for a mailbox). Only set/get/wait/multi_get/check/delete_key, which every c10d Store
has, so FileStore, HashStore, TCPStore and PrefixStores over them all work. The plane also holds the
communicator's health: once an exchange times out the communicator is broken and every later op says why.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch.distributed as dist

from simulator import connections, timeouts
from simulator.errors import RankTimeout, SimError
from simulator.mailbox import Mailbox, MailboxGone
from simulator.wire import mailbox_key, phase_key

_SLICE_S = 0.1  # longest single sleep: a wait rechecks its condition (and the deadline) at least this often


@dataclass
class Boot:
    """What a communicator's creating rendezvous gave this rank: its own mailbox, made before it, and every
    member's mailbox reference, in member order, read from the rendezvous' records."""

    mailbox: Mailbox
    refs: list[str]


class ControlPlane:
    """Identity, store access and message exchange of one communicator on one rank."""

    def __init__(self, store: dist.Store, comm_id: str, members: list[int], my_rank: int, timeout_s: float,
                 *, root: dist.Store | None = None, prefixes: tuple[str, ...] = (), boot: Boot | None = None) -> None:
        if my_rank not in members:
            raise ValueError(f"comm {comm_id}: rank {my_rank} is not a member of {members}")
        self.comm_id = comm_id
        self.members = list(members)
        self.me = self.members.index(my_rank)
        self.n = len(self.members)
        self.timeout_s = timeout_s
        self.broken: str | None = None
        self.closed = False
        self._base = store
        self._root, self._prefixes = root, prefixes  # per-thread: `store` rebuilt over a reused connection
        self._tls = threading.local()
        self._posted: dict[tuple[str, int], str] = {}  # store keys of this rank's spilled messages
        self._boxes: list[Mailbox | None] = [None] * self.n
        self._boxes_lock = threading.Lock()
        self.mailbox: Mailbox | None = None
        self._refs = boot.refs if boot is not None and self.n > 1 else None
        if self._refs is not None:
            self.mailbox = self._boxes[self.me] = boot.mailbox  # type: ignore[union-attr]
        elif self.n > 1:
            self.mailbox = Mailbox(self.n)
            self._boxes[self.me] = self.mailbox
            # through the store the communicator was created with: the creating thread needs no connection of its own
            store.set(mailbox_key(self.me), self.mailbox.ref)

    def g(self, local: int) -> int:
        """The global rank of member ``local``."""
        return self.members[local]

    def where(self, seq: int | None = None) -> str:
        """'comm <id> seq <n>' for messages."""
        return f"comm {self.comm_id}" + ("" if seq is None else f" seq {seq}")

    def check_usable(self, op: str) -> None:
        """Raise if the communicator is closed or broken by an earlier failure."""
        if self.closed:
            raise SimError(f"{self.where()}: {op} on rank {self.g(self.me)} after close()")
        if self.broken:
            raise SimError(f"{self.where()}: {op} on rank {self.g(self.me)}: communicator is unusable "
                           f"after an earlier failure: {self.broken}")

    def timed_out(self, message: str) -> RankTimeout:
        """Mark the communicator broken by ``message`` and return the error to raise."""
        self.broken = message
        return RankTimeout(message)

    def store(self) -> dist.Store:
        """This thread's own store connection (a blocking wait must not stall other threads)."""
        return self._thread_store()[0]

    def _thread_store(self) -> tuple[dist.Store, dist.TCPStore | None]:
        """This thread's store, and the TCPStore connection under it when this thread alone holds one."""
        if self._root is not None:  # the thread's connection can change: streams hand theirs back when idle
            conn = connections.acquire(self._root)
            if getattr(self._tls, "conn", None) is not conn:
                st = conn
                for prefix in self._prefixes:  # innermost first, as `store` was built
                    st = dist.PrefixStore(prefix, st)
                self._tls.conn, self._tls.store = conn, st
            return self._tls.store, conn if conn is not self._root and isinstance(conn, dist.TCPStore) else None
        st = getattr(self._tls, "store", None)
        if st is None:
            try:
                st = self._base.clone()
            except (RuntimeError, AttributeError):
                st = self._base
            self._tls.store = st
        return st, None

    def peer(self, j: int) -> Mailbox | None:
        """Member ``j``'s mailbox, opened on first use; None while ``j`` has not posted it (no store wait). If ``j``
        closed it before this rank could open it, an empty one stands in (``j`` will post nothing more)."""
        box = self._boxes[j]
        if box is not None:
            return box
        if self._refs is not None:
            return self._open(j, self._refs[j])
        st = self.store()
        key = mailbox_key(j)
        if not st.check([key]):
            return None
        return self._open(j, st.get(key).decode())

    def opened(self, j: int) -> bool:
        """Whether member ``j``'s mailbox is open here already."""
        return self._boxes[j] is not None

    def _open(self, j: int, ref: str) -> Mailbox:
        with self._boxes_lock:
            box = self._boxes[j]
            if box is None:
                try:
                    box = Mailbox(self.n, ref)
                except MailboxGone:  # j left before this rank looked: it posts nothing more, so waits on it time out
                    box = Mailbox(self.n)
                    box.close()
                    box.gone = True
                self._boxes[j] = box
            return box

    def peers(self, js: Iterable[int], seq: int, what: str) -> list[Mailbox]:
        """The mailboxes of members ``js``, waiting (up to the timeout) for those not posted yet; a member that
        never posts one did not arrive, and is named so."""
        missing = [j for j in js if self._boxes[j] is None]
        if missing and self._refs is not None:
            for j in missing:
                self._open(j, self._refs[j])
        elif missing:
            st, own = self._thread_store()
            keys = [mailbox_key(j) for j in missing]
            try:
                if own is not None:  # TCPStore's multi_get waits for its keys (store timeout), saving a round trip
                    own.set_timeout(datetime.timedelta(seconds=self.timeout_s))
                    refs = st.multi_get(keys)
                elif timeouts.wait_keys(st, keys, self.timeout_s):
                    refs = st.multi_get(keys)
                else:
                    raise dist.DistStoreError("wait timeout")
            except dist.DistStoreError:
                absent = [j for j, k in zip(missing, keys, strict=True) if not st.check([k])]
                raise self._not_arrived(seq, what, absent) from None
            for j, ref in zip(missing, refs, strict=True):
                self._open(j, ref.decode())
        return [self._boxes[j] for j in js]  # type: ignore[misc]

    def _not_arrived(self, seq: int, what: str, missing: list[int]) -> RankTimeout:
        absent = sorted(self.g(j) for j in missing)
        arrived = sorted(set(map(self.g, range(self.n))) - set(absent))
        return self.timed_out(f"{self.where(seq)}: " + timeouts.message(
            f"{what} on rank {self.g(self.me)}", self.timeout_s,
            f"rank(s) {', '.join(map(str, absent))} did not arrive (arrived: {', '.join(map(str, arrived))})"))

    def wait_until(self, ready: Callable[[], bool], deadline: float) -> bool:
        """Sleep on this rank's bell until ``ready()`` (rechecked after every wake-up), at most until ``deadline``
        (time.monotonic()); False if the time ran out."""
        box = self.mailbox
        assert box is not None
        while True:
            seen = box.bell()
            if ready():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            box.sleep(seen, min(remaining, _SLICE_S))

    def ring(self, j: int) -> None:
        """Wake member ``j``'s waiting threads, if its mailbox is reachable yet (else it is not waiting on this
        rank: it checks what this rank posted when it opens this rank's mailbox)."""
        box = self.peer(j)
        if box is not None:
            box.ring(self.me)

    def exchange(self, seq: int, phase: str, body: str, *, to: Iterable[int], frm: Iterable[int],
                 what: str) -> dict[int, str]:
        """Post ``body`` for ranks ``to``, and collect the (seq, phase) message of every rank in ``frm``.

        Through the mailboxes: op ``seq`` uses region ``seq % 2`` of each. A rank posts for op ``seq`` only
        after it has read every peer's message of op ``seq - 1``, and peers post for op ``seq - 1`` only after
        reading this rank's message of op ``seq - 2``, so rewriting that region is safe. Every peer's mailbox
        is opened before this rank first posts, so a peer that has seen this rank's message has opened its
        mailbox. A message too large for its region goes under one store key per (phase, seq, sender); a rank
        deletes its keys of ops up to seq - 2 when it posts for op seq.
        """
        to, want = [j for j in to if j != self.me], [j for j in frm if j != self.me]
        if not to and not want:
            return {}
        boxes = self.peers(range(self.n), seq, what)
        box = self.mailbox
        assert box is not None
        if to:
            for done in [k for k in self._posted if k[1] <= seq - 2]:
                self.store().delete_key(self._posted.pop(done))
            raw = body.encode()
            if box.fits(phase, raw):
                box.post(phase, seq, raw)
            else:
                key = phase_key(phase, seq, self.me)
                self.store().set(key, body)
                self._posted[(phase, seq)] = key
                box.post(phase, seq, None)
            for j in to:
                boxes[j].ring(self.me)
        if not want:
            return {}
        deadline = time.monotonic() + self.timeout_s
        if not self.wait_until(lambda: all(boxes[j].posted(phase) >= seq for j in want), deadline):
            raise self._not_arrived(seq, what, [j for j in want if boxes[j].posted(phase) < seq])
        got = {}
        for j in want:
            raw = boxes[j].message(phase, seq)
            got[j] = self.store().get(phase_key(phase, seq, j)).decode() if raw is None else raw.decode()
        return got

    def close(self) -> None:
        """Close this rank's mailbox (peers keep what they mapped)."""
        self.closed = True
        if self.mailbox is not None:
            self.mailbox.close()
