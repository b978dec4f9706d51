"""Exceptions raised by the simulator's data plane."""

from __future__ import annotations


class SimError(RuntimeError):
    """Base class of every error raised by the simulator."""


class CollectiveMismatch(SimError):
    """Ranks issued different collectives (op, dtype, shape, root, reduce op or order) on one communicator."""


class RankTimeout(SimError):
    """A peer did not arrive in time; the message names the missing rank(s), the op, comm id and seq."""


class P2PMismatch(SimError):
    """A send and the receive it matched differ in size or dtype; the message names both ranks and the tag."""
