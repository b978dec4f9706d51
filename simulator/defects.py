"""Planted defect switches: one per historical bug the spec guards against. Off by default.

A simulator backend resolves its defects once, when it is registered (``simulator.register(defects=...)``,
plus ``SIM_DEFECTS=name1,name2`` from the environment at that moment), into a frozen ``Defects`` value
that its groups, communicators and works carry; nothing reads the environment afterwards. ``DEFECTS``
maps each name to a one-line description.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFECTS: dict[str, str] = {
    "batch_wait_no_wait": "isend/irecv works complete before the data has arrived (pytorch PR 82450)",
    "coalesced_async_no_works": "_coalescing_manager(async_ops=True) returns a work that covers nothing (issue 122807)",
    "coalesced_per_op_launch": "a coalesced block is launched op by op instead of once",
    "coalesced_drops_tail": "a coalesced block runs only its first op; the others are left untouched",
    "split_drops_options": "options given to split_group/new_group are dropped; the child gets defaults",
    "torchcomms_drops_options": "on the torchcomms path, process-group options never reach CommOptions.hints",
    "options_aliased": "a split child with no options aliases the parent's config instead of copying it",
    "hint_net_name_snake": "net_name is passed as hint 'net_name' instead of 'netName' (torchcomms ignores it)",
    "split_unbound_allowed": "split_group works on a parent with no bound device",
    "split_child_unbound": "a split child does not carry the parent's bound device",
    "split_nonmember_raises": "a non-member of a partial split raises instead of getting None",
    "p2p_pair_comm_eager": "send/recv create 2-rank pair communicators even under eager init",
    "p2p_comm_per_op": "lazy P2P creates a new communicator for every op instead of one per pair",
    "p2p_warn_missing": "lazy P2P issues no warning recommending a device binding",
    "p2p_warn_repeated": "lazy P2P warns on every op instead of once",
    "register_corrupts_maps": "registering the simulator backend overwrites a device another backend claims",
    "split_fresh_bootstrap": "a split child is bootstrapped afresh instead of split from its parent communicator",
    "invalid_options_accepted": "invalid option values and hint values are accepted silently",
    "unknown_hint_silent": "unknown hint keys are dropped without a warning",
    "split_out_of_range_hang": "split_group with a rank outside the parent hangs instead of refusing",
    "init_drops_options": "options given to init_process_group never reach the world communicator",
    "comm_id_by_members": "communicator ids derive from member ranks, so two groups of the same ranks collide",
    "p2p_anysource_wrong_rank": "recv(src=None) reports rank 0 as the source whoever sent",
    "p2p_mismatch_silent": "a recv whose size or dtype differs from the send returns as if it succeeded",
    "register_devices_none": "the simulator registers without devices, so torch claims cpu and cuda for it",
    # Bugs every path of the backend shares (a check comparing the backend with itself cannot see them).
    "avg_as_sum": "ReduceOp.AVG is computed as SUM (the division by the group size is missing)",
    "minmax_swapped": "ReduceOp.MIN and ReduceOp.MAX are swapped in the reduction kernel",
    "int_sum_via_float32": "integer SUM/AVG accumulate in float32, losing every bit above 2**24",
    "reduce_scatter_wrong_shard": "reduce_scatter_tensor hands each rank the shard of the next rank",
    "broadcast_root_zero": "broadcast copies from group rank 0 whatever the src",
    "barrier_no_wait": "barrier returns at once, without waiting for the other ranks",
    "alltoall_even_offsets": "all_to_all_single reads each sender's block at an offset that assumes equal splits",
    "coalesced_block_cap": "a coalesced block runs at most 8 ops; the ops after the 8th are left untouched",
    "p2p_recv_ignores_source": "recv(src=a) takes the oldest pending message from any sender, not from a",
    "p2p_pair_comm_unlogged": "eager P2P runs over 2-rank pair communicators whose creation is never recorded",
    "split_refusal_anonymous": "split_group refuses ranks outside the parent naming neither the rank nor the size",
    "newgroup_options_aliased": "a group keeps a reference to the caller's options and reads them live",
    "p2p_peer_unchecked": "send/recv do not check the peer; a peer outside the group fails with a bare IndexError",
    "split_ranks_as_global": "split_group of a subgroup reads the split's group ranks as global ranks",
    "p2p_warn_once_per_process": "the lazy-P2P warning is issued once per process, not once per group",
    "lazy_comm_default_config": "a subgroup's communicator created lazily, at first use, gets the default config",
}
# Mixed reduce ops in one _coalescing_manager block are not plantable here: torch 2.13's front end
# passes only the first op's reduce op to the backend, so no backend ever sees the mix.

ENV = "SIM_DEFECTS"


@dataclass(frozen=True)
class Defects:
    """The defect switches one simulator backend was created with (immutable)."""

    names: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = self.names - DEFECTS.keys()
        if unknown:
            raise ValueError(f"unknown simulator defect(s) {sorted(unknown)}; known: {sorted(DEFECTS)}")

    @classmethod
    def of(cls, names: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> Defects:
        """``names`` plus those listed in ``environ[SIM_DEFECTS]`` (comma-separated; default os.environ)."""
        listed = (environ if environ is not None else os.environ).get(ENV, "")
        return cls(frozenset(names) | {n.strip() for n in listed.split(",") if n.strip()})

    def on(self, name: str) -> bool:
        """True when defect ``name`` is switched on (an unknown name is a KeyError, not a silent False)."""
        if name not in DEFECTS:
            raise KeyError(f"unknown simulator defect {name!r}")
        return name in self.names


NONE = Defects()
