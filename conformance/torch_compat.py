"""What torch's own front end does, per torch version: the facts checks and targets depend on.

Each fact names the first torch that behaves the new way and the upstream line that shows it
(read in the installed wheels of 2.11.0, 2.13.0, 2.14.1 and 2.15.0). A check asks here instead
of hard-coding one torch's behaviour, so that a backend is judged against what torch itself
does on the running version.
"""

from __future__ import annotations

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


def defect_inapplicable(defect: str) -> str | None:
    """Why a planted defect (simulator switch or front-end mutant) is none on the running torch, or None."""
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
