"""Typed records the simulator's planes exchange (through the mailboxes, simulator.mailbox, or, when one does not
fit there, the store), and the store keys they live under when they go through the store.

Every record is a frozen dataclass encoded as JSON with its field names (data only, never pickle:
a store is shared with other processes). Keys are relative to one communicator's store prefix.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Splits:
    """How much an all_to_all sends to, and expects from, each member (row counts or shapes), and the
    byte size of each payload tensor when the tensors of one call differ in size."""

    sends: list[Any]
    expects: list[Any]
    nbytes: list[int] | None = None


@dataclass(frozen=True)
class OpMeta:
    """What one rank posts for one collective: the call it made, why it refuses it (None: it does not),
    and where its payload lies: in its slot (segment name and slot size), or, for a small payload,
    ``inline`` in this record (base64 of the packed bytes)."""

    call: str
    refusal: str | None
    segment: str | None
    slot_bytes: int
    splits: Splits | None = None
    inline: str | None = None

    def encode(self) -> str:
        """JSON text of this record."""
        splits = None if self.splits is None else asdict(self.splits)
        return json.dumps({"call": self.call, "refusal": self.refusal, "segment": self.segment,
                           "slot_bytes": self.slot_bytes, "splits": splits, "inline": self.inline})

    @classmethod
    def decode(cls, raw: str | bytes) -> OpMeta:
        """The record ``encode`` wrote."""
        data = json.loads(raw)
        splits = data.pop("splits")
        return cls(**data, splits=None if splits is None else Splits(**splits))


@dataclass(frozen=True)
class Envelope:
    """One P2P message on an ordered channel: its number there, tag, dtype, shape, and the segment
    holding its bytes (None for an empty tensor)."""

    number: int
    tag: int
    dtype: str
    shape: list[int] = field(default_factory=list)
    segment: str | None = None

    def encode(self) -> str:
        """JSON text of this record."""
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: str | bytes) -> Envelope:
        """The record ``encode`` wrote."""
        return cls(**json.loads(raw))

    def describe(self) -> str:
        """'float32[2,3]' for the tensor this envelope carries."""
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


# ----------------------------------------------------------------------------- store keys
def phase_key(phase: str, seq: int, rank: int) -> str:
    """Message of local ``rank`` for phase ``phase`` ("meta", "reduced") of collective ``seq``."""
    return f"op/{seq}/{phase}/{rank}"


def envelope_key(src: int, dst: int, number: int) -> str:
    """Envelope ``number`` of the channel from local rank ``src`` to ``dst``."""
    return f"p2p/{src}>{dst}/{number}"


def rejected_key(src: int, dst: int) -> str:
    """The receiver's report on a send from ``src`` it rejected."""
    return f"p2p/{src}>{dst}/rejected"


def mailbox_key(rank: int) -> str:
    """The reference of local ``rank``'s mailbox (simulator.mailbox), posted once when it creates the communicator."""
    return f"mbox/{rank}"
