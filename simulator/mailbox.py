"""Each rank's control segment of one communicator: the per-op control plane in shared memory.

A rank's mailbox is a memfd of its own (no name in /dev/shm, so nothing outlives a killed rank), which
peers open once through ``/proc/<pid>/fd/<fd>`` (its reference, posted in the store when the communicator
is created: the store's only part in it). Every word is written by the mailbox's owner alone, except
the bell, which peers ring. Layout (64-bit words, then byte regions):

- ``BELL``: the futex word this rank's waiting threads sleep on; a peer that posts something this rank
  may wait for stores a token of its own there (its rank and a count: never a value seen before) and
  wakes it (:mod:`simulator.futex`);
- ``TOKEN`` (tells a reused fd number apart), and per phase of a collective the last ``seq`` posted and
  the length of the message in each of two regions (op ``seq`` uses region ``seq % 2``; see
  :mod:`simulator.control` for why two suffice);
- per peer: P2P envelopes sent to it, envelopes taken from it, receives posted for it, its sends
  this rank rejected, and the op whose slot segment of the peer's this rank has mapped last
  (:mod:`simulator.slots`); receives posted for any source;
- per ordered channel to each peer: a ring of ``RING`` envelope slots, each stamped with the number
  of the envelope it holds;
- what this rank is blocked in (text), read by peers' deadlock reports.

A message that does not fit its region (a collective's metadata over 64 KiB, an envelope over 256 bytes,
or an envelope whose ring slot still holds an untaken one) goes through the store instead, and its
length word says so (``SPILLED``); the store then carries that one message, never the wake-up.
x86_64 keeps stores in order, so a length or count written after its bytes is seen after them.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os

from simulator import futex, shm

META_BYTES = 64 << 10
RING = 32
ENVELOPE_BYTES = 256
BLOCKED_BYTES = 512
SPILLED = -1

BELL, TOKEN, ANY_POSTED, BLOCKED_LEN = 0, 1, 2, 3
PHASES = {"meta": 4, "reduced": 7}  # each: seq word, then the lengths of regions 0 and 1
_FIXED = 10
_tokens = itertools.count(1)


class MailboxGone(FileNotFoundError):
    """The owner of a mailbox closed it (its communicator was destroyed, or its process ended) before it
    was opened here."""


class Mailbox:
    """One rank's control segment, as its owner (``ref`` None: created here) or a peer (``ref``: opened)."""

    def __init__(self, n: int, ref: str | None = None) -> None:
        self.n = n
        self.gone = False  # a stand-in for a peer's mailbox closed before this rank opened it (ControlPlane.peer)
        self._sent, self._taken, self._posted, self._rejected, self._mapped = (_FIXED + i * n for i in range(5))
        self._stamps = _FIXED + 5 * n
        self._env_len = self._stamps + n * RING
        words = self._env_len + n * RING
        self._blocked = words * 8
        self._meta = self._blocked + BLOCKED_BYTES
        self._ring = self._meta + 2 * META_BYTES
        size = self._ring + n * RING * ENVELOPE_BYTES
        self.fd = -1
        if ref is None:
            self.fd = os.memfd_create("sim-mailbox", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)
            token = int.from_bytes(os.urandom(7), "little")
            self.ref = f"{os.getpid()}:{self.fd}:{token}"
        else:
            try:
                own, token = shm.open_peer_fd(ref)
            except FileNotFoundError:
                raise MailboxGone(ref) from None
            try:
                if os.fstat(own).st_size != size:
                    raise MailboxGone(ref)
                self._map = mmap.mmap(own, size)
            finally:
                os.close(own)
            self.ref = ref
        self.words = (ctypes.c_int64 * words).from_buffer(self._map)
        self._bell = ctypes.c_int32.from_buffer(self._map)
        self.bell_address = ctypes.addressof(self._bell)
        if ref is None:
            self.words[TOKEN] = token
            for slot in range(n * RING):
                self.words[self._stamps + slot] = -1
        elif self.words[TOKEN] != token:  # the fd number was reused for another file
            raise MailboxGone(ref)

    # ------------------------------------------------------------------ wake-ups
    def bell(self) -> int:
        """The bell's value now: read it before checking a condition, then ``sleep(value, ...)``."""
        return self._bell.value

    def sleep(self, seen: int, timeout_s: float) -> None:
        """Sleep until the bell rings after it read ``seen``, at most ``timeout_s`` (the owner's threads only)."""
        futex.wait(self.bell_address, seen, timeout_s)

    def ring(self, me: int) -> None:
        """Wake the owner's waiting threads (called by peer ``me`` after posting something)."""
        self._bell.value = ((me & 0xFF) << 23) | (next(_tokens) & 0x7FFFFF)
        futex.wake(self.bell_address)

    # ------------------------------------------------------------------ collectives
    @staticmethod
    def fits(phase: str, body: bytes) -> bool:
        """Whether ``body`` fits a region of ``phase`` (only metadata has room; other phases carry nothing)."""
        return len(body) <= (META_BYTES if phase == "meta" else 0)

    def post(self, phase: str, seq: int, body: bytes | None) -> None:
        """Publish this rank's ``body`` for op ``seq`` (None: the message is in the store; ``fits`` says)."""
        base = PHASES[phase]
        region = seq % 2
        if body is not None:
            start = self._meta + region * META_BYTES
            self._map[start:start + len(body)] = body
        self.words[base + 1 + region] = SPILLED if body is None else len(body)
        self.words[base] = seq

    def posted(self, phase: str) -> int:
        """The last op whose ``phase`` message this mailbox's owner has posted."""
        return self.words[PHASES[phase]]

    def message(self, phase: str, seq: int) -> bytes | None:
        """The owner's ``phase`` message of op ``seq`` (posted), or None if it went through the store."""
        region = seq % 2
        length = self.words[PHASES[phase] + 1 + region]
        if length == SPILLED:
            return None
        start = self._meta + region * META_BYTES
        return self._map[start:start + length]

    # ------------------------------------------------------------------ P2P counters
    def sent(self, peer: int) -> int:
        """Envelopes the owner has posted to ``peer``."""
        return self.words[self._sent + peer]

    def taken(self, peer: int) -> int:
        """Envelopes the owner has taken from ``peer``'s channel."""
        return self.words[self._taken + peer]

    def set_taken(self, peer: int, count: int) -> None:
        self.words[self._taken + peer] = count

    def receives_posted(self, peer: int | None) -> int:
        """Receives the owner has posted for messages from ``peer`` (None: from any source)."""
        return self.words[ANY_POSTED if peer is None else self._posted + peer]

    def add_receive_posted(self, peer: int | None) -> None:
        self.words[ANY_POSTED if peer is None else self._posted + peer] += 1

    def rejected(self, peer: int) -> int:
        """How many of ``peer``'s sends the owner has rejected (the reports are in the store)."""
        return self.words[self._rejected + peer]

    def add_rejected(self, peer: int) -> None:
        self.words[self._rejected + peer] += 1

    def mapped(self, peer: int) -> int:
        """The op at which the owner mapped ``peer``'s current slot segment (0: none yet)."""
        return self.words[self._mapped + peer]

    def set_mapped(self, peer: int, seq: int) -> None:
        self.words[self._mapped + peer] = seq

    # ------------------------------------------------------------------ P2P envelopes
    def put_envelope(self, dst: int, number: int, body: bytes, taken: int) -> bool:
        """Write envelope ``number`` to ``dst`` in its ring slot, given that ``dst`` has taken ``taken`` of this
        channel's envelopes; False when it must go through the store (too large, or its slot still busy).
        ``mark_sent`` publishes it."""
        slot = dst * RING + number % RING
        fits = len(body) <= ENVELOPE_BYTES and number - taken < RING
        if fits:
            start = self._ring + slot * ENVELOPE_BYTES
            self._map[start:start + len(body)] = body
            self.words[self._env_len + slot] = len(body)
            self.words[self._stamps + slot] = number
        return fits

    def mark_sent(self, dst: int, count: int) -> None:
        """Publish that ``count`` envelopes to ``dst`` are posted (after their bytes, or their store keys)."""
        self.words[self._sent + dst] = count

    def envelope(self, dst: int, number: int) -> bytes | None:
        """Envelope ``number`` of the owner's channel to ``dst`` (posted), or None if it went through the store."""
        slot = dst * RING + number % RING
        if self.words[self._stamps + slot] != number:
            return None
        start = self._ring + slot * ENVELOPE_BYTES
        return self._map[start:start + self.words[self._env_len + slot]]

    # ------------------------------------------------------------------ blocked
    def set_blocked(self, text: str | None) -> None:
        """Say what the owner is blocked in (None: nothing)."""
        raw = b"" if text is None else text.encode()[:BLOCKED_BYTES]
        self._map[self._blocked:self._blocked + len(raw)] = raw
        self.words[BLOCKED_LEN] = len(raw)

    def blocked(self) -> str | None:
        """What the owner says it is blocked in, or None."""
        length = self.words[BLOCKED_LEN]
        return self._map[self._blocked:self._blocked + length].decode(errors="replace") if length else None

    def close(self) -> None:
        """Close the owner's fd (peers keep their mappings; no one can open it afterwards)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
