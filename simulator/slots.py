"""The collective slot protocol: where each rank's payload for a collective lies in shared memory.

Each rank owns one pooled segment holding two slots; op ``seq`` writes slot ``seq % 2``. A rank
finishing op ``s`` has seen every peer's metadata for op ``s``, which peers post only after
finishing op ``s - 1``, so by the time it writes slot ``s % 2`` again (op ``s + 2``) nobody reads
it any more. A segment's name is unlinked by its owner as soon as every peer has mapped it (each peer
says so in its mailbox, :mod:`simulator.mailbox`, and rings the owner), so nothing stays in /dev/shm
after an op, and the memory is freed by the kernel when the last process holding a mapping exits,
even on SIGKILL.
"""

from __future__ import annotations

import time

from torch import Tensor

from simulator import shm, timeouts
from simulator.control import ControlPlane
from simulator.errors import SimError
from simulator.wire import OpMeta

_PAGE = 4096
_MIN_SLOT = 1 << 16


class SlotPlane:
    """This rank's pooled segment and its mappings of its peers' segments, for one communicator."""

    def __init__(self, control: ControlPlane, stem: str) -> None:
        self._ctl = control
        self._stem = stem
        self.segment: str | None = None
        self.slot_bytes = 0
        self._own: Tensor | None = None
        self._names: list[str] = []
        self._fresh: str | None = None  # own segment created for the op in flight, not yet mapped by peers
        self._peer: list[tuple[str, Tensor] | None] = [None] * control.n

    def own_slot(self, seq: int, need: int) -> Tensor:
        """This rank's slot for op ``seq``, growing the pooled segment when ``need`` bytes do not fit."""
        if need > self.slot_bytes:
            slot = -(-max(_MIN_SLOT, need, 2 * self.slot_bytes) // _PAGE) * _PAGE
            name = f"{self._stem}.s{seq}"
            self._own = shm.create(name, 2 * slot)
            self.segment, self.slot_bytes = name, slot
            self._names.append(name)
            if self._ctl.n == 1:
                shm.unlink(name)
            else:
                self._fresh = name
        assert self._own is not None
        start = (seq % 2) * self.slot_bytes
        return self._own[start:start + self.slot_bytes]

    def map_peers(self, seq: int, metas: list[OpMeta], what: str) -> None:
        """Map peers' new segments and say so in this rank's mailbox; the owner of a new segment waits until every
        peer has mapped it, then unlinks its name.

        So once any rank has finished the op that published a segment every member holds a mapping, and
        close() can never pull it from a peer.
        """
        ctl = self._ctl
        own = ctl.mailbox
        for j, meta in enumerate(metas):
            name = meta.segment
            current = self._peer[j]
            if j == ctl.me or name is None or (current is not None and current[0] == name):
                continue
            try:
                self._peer[j] = (name, shm.open_segment(name))
            except FileNotFoundError:
                raise SimError(f"{ctl.where(seq)}: shared-memory segment {name} of rank {ctl.g(j)} "
                               f"is gone (was it swept?)") from None
            assert own is not None
            own.set_mapped(j, seq)
            ctl.ring(j)
        fresh, self._fresh = self._fresh, None
        if fresh is None:
            return
        boxes = ctl.peers(range(ctl.n), seq, what)
        peers = [j for j in range(ctl.n) if j != ctl.me]
        if not ctl.wait_until(lambda: all(boxes[j].mapped(ctl.me) >= seq for j in peers),
                              time.monotonic() + ctl.timeout_s):
            mapped = sum(boxes[j].mapped(ctl.me) >= seq for j in peers)
            raise ctl.timed_out(f"{ctl.where(seq)}: " + timeouts.message(
                f"{what} on rank {ctl.g(ctl.me)}", ctl.timeout_s,
                f"peers did not map segment {fresh} ({mapped} of {ctl.n - 1} did)"))
        shm.unlink(fresh)

    def slot(self, seq: int, j: int, meta: OpMeta) -> Tensor | None:
        """Member ``j``'s slot for op ``seq`` (None if it posted no payload)."""
        base = self._own if j == self._ctl.me else (self._peer[j] or (None, None))[1]
        if base is None:
            return None
        start = (seq % 2) * meta.slot_bytes
        return base[start:start + meta.slot_bytes]

    def close(self) -> None:
        """Unlink every segment this rank created and drop all mappings."""
        for name in self._names:
            shm.unlink(name)
        self._own, self._peer = None, [None] * self._ctl.n
