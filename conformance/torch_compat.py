"""What torch's own front end does, per torch version: the facts checks and targets depend on.

Each fact names the first torch that behaves the new way and the upstream line that shows it
(read in the installed wheels of 2.11.0, 2.13.0, 2.14.1 and 2.15.0). A check asks here instead
of hard-coding one torch's behaviour, so that a backend is judged against what torch itself
does on the running version.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from packaging.version import Version

TORCH = Version(Version(torch.__version__).base_version)


def since(version: str, running: Version | None = None) -> bool:
    """True when the running torch (or ``running``) is ``version`` or newer."""
    return (running or TORCH) >= Version(version)


def split_nonmember_value() -> Any:
    """What split_group returns on a rank in no split: None up to 2.13, NON_GROUP_MEMBER from 2.14.

    v2.13.0 distributed_c10d.py:5701 ``return None``; v2.14.1 :6767 and v2.15.0 :6999
    ``return GroupMember.NON_GROUP_MEMBER``.
    """
    return dist.GroupMember.NON_GROUP_MEMBER if since("2.14") else None


def split_keeps_order() -> bool:
    """split_group keeps each split's rank order from 2.14 (2.13 sorted: v2.13.0 :5682)."""
    return since("2.14")


def split_child_ranks(ranks: list[int]) -> list[int]:
    """The child's global ranks torch gives for one split of the world, in torch's order."""
    return list(ranks) if split_keeps_order() else sorted(ranks)


def split_refuses_unbound() -> bool:
    """split_group refuses an unbound default group up to 2.14 (v2.14.1 :6610); 2.15 dropped it."""
    return not since("2.15")


# Planted defects that are a stack's own design there, so they plant nothing on it.
STACK_DESIGN: dict[str, dict[str, str]] = {
    "nccl-lazy": {
        "p2p_pair_comm_eager": "nccl-lazy runs P2P on 2-rank pair communicators under eager init by design "
                               "(v2.15.0 distributed_c10d.py:880)",
        "p2p_recv_ignores_source": "on nccl-lazy every receive is on a 2-rank pair communicator, where the one "
                                   "sender is the named source",
    },
}
# Stacks that send on one 2-rank communicator per peer pair by design.
PAIR_P2P_STACKS = frozenset({"nccl-lazy"})


def defect_inapplicable(defect: str, stack: str | None = None) -> str | None:
    """Why a planted defect (simulator defect or front-end mutant) is none on the running torch (or, for a
    simulator defect, on ``stack``), or None."""
    if stack and (why := STACK_DESIGN.get(stack, {}).get(defect)):
        return why
    if defect == "split_unbound_allowed" and not split_refuses_unbound():
        return (f"torch {TORCH} itself splits a parent with no bound device: the refusal this defect removes "
                "is gone from split_group since 2.15 (v2.14.1 distributed_c10d.py:6610 was the last)")
    if defect == "frontend_filter_ignored" and not since("2.13"):
        return f"torch {TORCH}'s split_group has no backend filter to ignore (v2.11.0 distributed_c10d.py:5198)"
    if defect == "frontend_mixed_types_swallowed" and not since("2.13"):
        return (f"torch {TORCH}'s _coalescing_manager has no mixed-type refusal to swallow: it runs the block "
                "as its first op's type (v2.11.0 distributed_c10d.py:2751)")
    return None


def batch_coalesces_python_groups() -> bool:
    """batch_isend_irecv coalesces for any ProcessGroup subclass from 2.14.

    v2.13.0 :3049 ``type(group) is ProcessGroup``; v2.14.1 :3683 ``isinstance(group, ProcessGroup)``.
    """
    return since("2.14")


# What the `nccl` backend string builds, by the first torch that builds it (one entry per change; a torch
# 2.16 that changed it again would be one more line). v2.15.0 distributed_c10d.py:961-983 registers
# `nccl` with _create_nccl2_process_group unless TORCH_DIST_USE_NCCL2=0 (:964), and registers the others
# by name: nccl-legacy (:986), nccl2 (:1006), nccl-lazy (:1015); up to 2.14, `nccl` is ProcessGroupNCCL.
NCCL_MEANS: dict[str, str] = {"0": "nccl-legacy", "2.15": "nccl2"}
NCCL2_OPT_OUT = "TORCH_DIST_USE_NCCL2"


def default_stack(environ: dict[str, str] | None = None, running: Version | None = None) -> str:
    """The NCCL stack the running torch's ``nccl`` means: the simulator's and the reports' default stack."""
    environ = os.environ if environ is None else environ  # read, not copied: a check's target is made per rank
    stack = next(name for first, name in sorted(NCCL_MEANS.items(), key=lambda kv: Version(kv[0]), reverse=True)
                 if since(first, running))
    return "nccl-legacy" if stack == "nccl2" and environ.get(NCCL2_OPT_OUT) == "0" else stack



# Stacks whose process group has no perform_nocolor_split (v2.15.0 torch/_C/_distributed_c10d.pyi:1186-1210;
# ProcessGroupNCCL has it, :940), which torch calls on every non-member of a new_group in a bound world
# (v2.15.0 distributed_c10d.py:3020): there the non-members fail with "'ProcessGroupNCCL2' object has no
# attribute 'perform_nocolor_split'", and subgroups are made with split_group (Megatron-LM PR 5385).
NO_NONMEMBER_SPLIT = frozenset({"nccl2", "nccl-lazy"})


def nonmember_new_group_works(stack: str | None) -> bool:
    """Whether a bound world on ``stack`` can make a new_group that leaves some ranks out."""
    return stack not in NO_NONMEMBER_SPLIT


def new_group_splits(stack: str | None) -> bool:
    """Whether a new_group of the world's backend in a bound world on ``stack`` gets a communicator split from the
    world's, on the running torch: not on torch 2.15's torchcomms routing, which makes it with new_comm among its
    members (v2.15.0 distributed_c10d.py:7130-7137, :3015-3024; 2.13 split it, v2.13.0 :5836-5862). The version
    fact is kept once, with the stack's other routing facts: ``simulator.stacks`` (``new_group_splits``)."""
    from simulator.stacks import STACKS

    group = STACKS.get(stack or "")
    return group is None or group.new_group_splits


def members_only_new_group_refused(stack: str | None) -> bool:
    """Whether torch refuses new_group(use_local_synchronization=True) in a world on ``stack``, whatever the new
    group's backend: where it makes every new_group through split_group (torch 2.13's torchcomms routing,
    v2.13.0 distributed_c10d.py:5836-5862, refused at :5893-5898). The version fact is kept with the stack's
    other routing facts: ``simulator.stacks`` (``new_group_via_split``)."""
    from simulator.stacks import STACKS

    group = STACKS.get(stack or "")
    return group is not None and group.new_group_via_split
