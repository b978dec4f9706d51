"""The NCCL stacks the simulator models, each a process group class over the reference one.

What each stack does differently, as read in torch's source (v2.15.0 distributed_c10d.py unless said):

- ``nccl-legacy``: ProcessGroupNCCL, the reference (``SimProcessGroup``): eager when bound, else lazy,
  with lazily created 2-rank pair communicators for unbatched P2P on a group not bound when made (also after a
  collective made the group's communicator), and a batch's P2P on the group's communicator. What ``nccl`` means up to
  torch 2.14, and on 2.15 with ``TORCH_DIST_USE_NCCL2=0`` (:961-983; registered as ``nccl-legacy`` :986).
- ``nccl2``: ProcessGroupNCCL2, what ``nccl`` means on torch 2.15 (:964, registered as ``nccl2`` :1006).
  It always binds a device (``_nccl2_device`` binds the group when no ``device_id`` was given, :820-849),
  so its communicators are eager and P2P runs on the group's communicator; it has no
  ``perform_nocolor_split`` (torch/_C/_distributed_c10d.pyi:1186-1199, against ProcessGroupNCCL's :940),
  which torch calls on non-members of an eager ``new_group`` (:3020): they fail with AttributeError.
- ``nccl-lazy``: ProcessGroupNCCLLazy (:880, registered :1015): built like nccl2 (bound, eager, no
  ``perform_nocolor_split``, pyi :1201), but send/recv run on one lazily created 2-rank communicator per
  peer pair, by design (no warning), while collectives run on the group's communicator.
- ``torchcomms``: c10d routed through torchcomms (``torch.distributed.config.use_torchcomms``): the
  communicator is made eagerly by ``new_comm`` and its options reach it as ``CommOptions.hints`` under
  the names torchcomms reads; P2P runs on the communicator (torchcomms' nccl backend has no pair
  communicators). Front-end differences of the routing (torch 2.13 drops pg options on it, a TODO at
  v2.13.0 :2113, and refuses ``new_group(use_local_synchronization=True)``, :5893) are torch's, not a
  backend's: ``conformance.torch_compat`` keeps them. torch 2.15 makes a new_group's communicator with
  ``new_comm`` among its members (not split from the world's; :7130-7136, :3015-3024), so members-only groups
  return there.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.backend import SimProcessGroup
from simulator.comm import Communicator
from simulator.config import TORCHCOMMS_HINT_KEYS, SimOptions, options_to_hints, parse_hints
from simulator.shim import TORCH, virtual_device


class _Absent:
    """A method the stack's process group does not have: reading it raises AttributeError as Python would."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        raise AttributeError(f"'{(owner or type(obj)).__name__}' object has no attribute '{self.name}'")


class _AlwaysBound(SimProcessGroup):
    """A stack whose groups always have a device (bound at creation) and so an eager communicator."""

    perform_nocolor_split = _Absent()

    def creation_binding(self, bound: Any) -> Any:
        return bound if bound is not None else virtual_device()

    def setGroupName(self, name: str) -> None:
        """Torch names the group right after creating it: a bound world creates its communicator then."""
        super().setGroupName(name)
        if self._comm is None and (self._is_world or not self.new_group_splits) and self.bound_device_id is not None:
            self.eager_connect_single_device(self.bound_device_id)

    def _p2p_comm(self, peer_group_rank: int) -> tuple[Communicator, int, str]:
        peer = self._global_ranks[peer_group_rank]
        pair = self._pair(self.my_global_rank, peer)
        comm = self._main_comm()
        return comm, comm.local(peer), f"p2p:{pair[0]}-{pair[1]}"


class ProcessGroupNCCL2(_AlwaysBound):
    """``nccl2``: always bound, P2P on the group's communicator, no ``perform_nocolor_split``."""


class ProcessGroupNCCLLazy(_AlwaysBound):
    """``nccl-lazy``: as nccl2, but send/recv on one lazily created 2-rank communicator per peer pair."""

    def recv_anysource(self, tensors: list[Any], tag: int = 0) -> Any:
        """Refused: senders use their own pair communicators, so no communicator sees every sender."""
        raise RuntimeError(f"rank {self.my_global_rank}: recv(src=None) is not supported on nccl-lazy: each "
                           "sender sends on its own 2-rank pair communicator, so no communicator sees every sender")

    def _p2p_comm(self, peer_group_rank: int) -> tuple[Communicator, int, str]:
        peer = self._global_ranks[peer_group_rank]
        pair = self._pair(self.my_global_rank, peer)
        comm = self._pair_comm(pair)
        return comm, comm.local(peer), f"p2p:{pair[0]}-{pair[1]}"

    def _batched_p2p_comm(self, peer_group_rank: int) -> tuple[Communicator, int, str]:
        """A batch's P2P on the pairs' communicators too (kept from before ProcessGroupNCCL's batch rule was
        modelled; ProcessGroupNCCLLazy's own batch path not read)."""
        return self._p2p_comm(peer_group_rank)


class TorchcommsPath(_AlwaysBound):
    """``torchcomms``: a communicator's config is the hints its options translate to; P2P on it; a non-member
    of a split takes part with no colour (torchcomms' ``split([])``); a new_group's communicator is split from the
    world's (torch 2.13) or a fresh one among its members (2.15)."""

    # torch 2.13 makes every new_group (every backend's but "fake") through split_group on this routing (v2.13.0
    # distributed_c10d.py:5836-5862); 2.15 makes a subgroup's communicator with new_comm among its members alone,
    # and its non-members take no part (v2.15.0 :7130-7136, :3015-3024; new_comm via :3062-3074)
    new_group_splits = new_group_via_split = Version("2.15") > TORCH

    def perform_nocolor_split(self, device: Any) -> None:
        """A non-member of a new_group: takes part in the split with no colour (torchcomms' ``split([])``, torch
        2.13), or in nothing where the members make a fresh communicator (2.15, v2.15.0 :3020)."""
        if self.new_group_splits:
            SimProcessGroup.perform_nocolor_split(self, device)  # _AlwaysBound's is absent

    def refuse_local_synchronization(self, ranks: list[int]) -> None:
        """torch 2.13's torchcomms routing delegates new_group to split_group and refuses a members-only group
        in these words (v2.13.0 distributed_c10d.py:5893-5898)."""
        raise NotImplementedError("new_group cannot delegate to split_group with use_local_synchronization=True; "
                                  "split_group requires all ranks in the parent group to participate.")

    def _effective_config(self, options: SimOptions, comm_name: str, warn: bool = True) -> dict[str, Any]:
        """The config the communicator gets from its hints alone: each option field read back from the hint
        torchcomms maps into ncclConfig_t (or consumes itself), and the hints as parsed."""
        hints = parse_hints(self._torchcomms_hints(options), comm_name, self._warn_hint if warn else None)
        config = {name: next((hints[k] for k in keys if k in hints), None)
                  for name, keys in TORCHCOMMS_HINT_KEYS.items()}
        config["is_high_priority_stream"] = bool(config["is_high_priority_stream"])
        return {**config, "hints": hints}

    def _torchcomms_hints(self, options: SimOptions) -> dict[str, str]:
        """The hints torchcomms gets for ``options`` (``netName``, ``cgaClusterSize``, ...)."""
        return options_to_hints(options)


STACKS: dict[str, type[SimProcessGroup]] = {
    "nccl-legacy": SimProcessGroup,
    "nccl2": ProcessGroupNCCL2,
    "nccl-lazy": ProcessGroupNCCLLazy,
    "torchcomms": TorchcommsPath,
}

