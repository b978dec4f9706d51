"""The control plane of one communicator on one rank: who it is, per-thread store connections, and
the per-op message exchange.

Only set/wait/multi_get/check/delete_key, which every c10d Store has, so FileStore, HashStore,
TCPStore and PrefixStores over them all work. The plane also holds the communicator's health: once
an exchange times out the communicator is broken and every later op says why.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterable

import torch.distributed as dist

from simulator import connections, timeouts
from simulator.errors import RankTimeout, SimError
from simulator.wire import phase_key


class ControlPlane:
    """Identity, store access and message exchange of one communicator on one rank."""

    def __init__(self, store: dist.Store, comm_id: str, members: list[int], my_rank: int, timeout_s: float,
                 *, root: dist.Store | None = None, prefixes: tuple[str, ...] = ()) -> None:
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
        self._posted: dict[tuple[str, int], str] = {}

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

    def exchange(self, seq: int, phase: str, body: str, *, to: Iterable[int], frm: Iterable[int],
                 what: str) -> dict[int, str]:
        """Post ``body`` for ranks ``to``, and collect the (seq, phase) message of every rank in ``frm``.

        One key per (phase, seq, sender). A rank deletes its keys of ops up to seq - 2 when it posts
        for op seq: every reader of such a key read it before posting its own message for op seq - 1,
        which this rank has seen.
        """
        st, own = self._thread_store()
        if any(j != self.me for j in to):
            key = phase_key(phase, seq, self.me)
            st.set(key, body)
            for done in [k for k in self._posted if k[1] <= seq - 2]:
                st.delete_key(self._posted.pop(done))
            self._posted[(phase, seq)] = key
        want = [j for j in frm if j != self.me]
        if not want:
            return {}
        keys = [phase_key(phase, seq, j) for j in want]
        try:
            if own is not None:  # TCPStore's multi_get waits for its keys (store timeout), saving a round trip
                own.set_timeout(datetime.timedelta(seconds=self.timeout_s))
                values = st.multi_get(keys)
            elif timeouts.wait_keys(st, keys, self.timeout_s):
                values = st.multi_get(keys)
            else:
                raise dist.DistStoreError("wait timeout")
        except dist.DistStoreError:
            missing = [self.g(j) for j, k in zip(want, keys, strict=True) if not st.check([k])]
            arrived = sorted({self.g(self.me)} | {self.g(j) for j in want} - set(missing))
            raise self.timed_out(f"{self.where(seq)}: " + timeouts.message(
                f"{what} on rank {self.g(self.me)}", self.timeout_s,
                f"rank(s) {', '.join(map(str, sorted(missing)))} did not arrive "
                f"(arrived: {', '.join(map(str, arrived))})")) from None
        return {j: v.decode() for j, v in zip(want, values, strict=True)}
