"""Checks bound to requirement ids, and the context a check runs with on every rank."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from conformance.checks.cases import Generation
from conformance.outcomes import CheckFailed
from conformance.probe import Probe
from conformance.spec import AREAS, Requirement, SpecError
from conformance.targets.base import Driver, WorldSpec
from conformance.torch_compat import nonmember_new_group_works

CheckFn = Callable[["CheckContext"], None]
_REGISTRY: dict[str, CheckFn] = {}


def check(requirement_id: str) -> Callable[[CheckFn], CheckFn]:
    """Bind the decorated function to a requirement id."""

    def bind(fn: CheckFn) -> CheckFn:
        if requirement_id in _REGISTRY and _REGISTRY[requirement_id] is not fn:
            raise SpecError("<checks>", requirement_id, "id", f"two checks for one requirement: {fn.__module__}")
        _REGISTRY[requirement_id] = fn
        return fn

    return bind


def load_checks() -> dict[str, CheckFn]:
    """Import every area's check module and return the registry."""
    for area in AREAS:
        importlib.import_module(f"conformance.checks.{area}")
    return dict(_REGISTRY)


def bind_checks(requirements: list[Requirement]) -> dict[str, CheckFn]:
    """Pair requirements with checks; a requirement with no check (or the reverse) is an error."""
    checks = load_checks()
    ids = {r.id for r in requirements}
    for req in requirements:
        if req.id not in checks:
            raise SpecError(f"{req.area}.toml", req.id, "id", "requirement has no check")
    for rid, fn in checks.items():
        if rid not in ids:
            raise SpecError(f"{fn.__module__}", rid, "id", "check has no requirement in the spec")
    return checks


@dataclass
class CheckContext:
    """Everything a check sees on one rank."""

    rank: int
    world_size: int
    target: Driver
    store: dist.Store
    requirement: Requirement
    timeout_s: float
    notes: list[str] = field(default_factory=list)
    generation: Generation = field(default_factory=Generation.from_env)
    agreements: dict[str, int] = field(default_factory=dict)  # generated.agree's per-topic counters
    covered: set[str] = field(default_factory=set)  # plans whose coverage line this rank has noted
    # optional_case's kinds: the first call of each and its refusal (None: it ran); a generated case's kind
    # refused once is not retried (checks.common.refused_before)
    support: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    poll_failed: bool = False  # a polled Work never reported is_completed() (program_steps._poll): later ones wait
    _worlds: int = 0

    @property
    def probe(self) -> Probe:
        """The target's probe on this rank."""
        return self.target.probe()

    @property
    def device(self) -> Any:
        """The device this rank's tensors live on."""
        return self.target.device(self.rank)

    def init_world(self, mode: str = "eager", backend: str | None = None, pg_options: Any = None,
                   timeout_s: float | None = None, **extra: Any) -> dist.ProcessGroup:
        """Init the default group on the target (eager = device-bound, lazy = unbound).

        ``timeout_s`` caps the group's timeout below the check's, for a check whose correct outcome is
        immediate (a refusal): a backend that hangs instead is seen after that long, not the whole check's.
        """
        spec = WorldSpec(mode=mode, backend=backend, pg_options=pg_options, extra=extra)
        self._worlds += 1
        sub = dist.PrefixStore(f"world{self._worlds}/", self.store)
        limit = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        return self.target.init_world(sub, self.rank, self.world_size, spec, limit)

    def new_group(self, ranks: list[int], timeout_s: float | None = None, **kwargs: Any) -> Any:
        """``dist.new_group(ranks, **kwargs)`` with the check's timeout (torch's default is 30 min), so that a
        backend hanging in the new group times out naming the absent ranks within the check's time;
        ``timeout_s`` caps it lower, as in ``init_world``.

        On a stack whose bound world cannot take non-members through new_group (``torch_compat``), the group
        is made as such users make it, with one ``split_group`` every rank calls; non-members get
        NON_GROUP_MEMBER either way."""
        timeout = timedelta(seconds=self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s))
        if self.subgroups_by_split() and set(ranks) != set(range(dist.get_world_size())):
            group = dist.split_group(split_ranks=[sorted(ranks)], timeout=timeout, **kwargs)
            return group if group is not None else dist.GroupMember.NON_GROUP_MEMBER
        return dist.new_group(ranks, timeout=timeout, **kwargs)

    def new_partition(self, parts: list[list[int]], **kwargs: Any) -> list[Any]:
        """Each part's group (NON_GROUP_MEMBER where this rank is not in it) for parts that hold every rank once;
        ``kwargs`` (pg_options) go to every call.
        Where ``new_group`` would split, one ``split_group`` of every part: a split that leaves ranks out
        registers a group on its members only, and torch before 2.15 salts the hashed name of the next split
        with that count, so members of a later split would name their group differently (v2.13.0
        distributed_c10d.py:5464-5468; 2.15 salts with a count every rank keeps, v2.15.0 :6728-6740).
        Elsewhere ``new_group`` per part, in order."""
        if not self.subgroups_by_split() or len(parts) == 1:
            return [self.new_group(part, **kwargs) for part in parts]
        mine = dist.split_group(split_ranks=parts, timeout=timedelta(seconds=self.timeout_s), **kwargs)
        return [mine if self.rank in part else dist.GroupMember.NON_GROUP_MEMBER for part in parts]

    def subgroups_by_split(self) -> bool:
        """Whether subgroups are made with split_group: a bound world on a stack whose new_group cannot take
        non-members (``torch_compat``)."""
        world = dist.group.WORLD
        return (not nonmember_new_group_works(self.target.target.stack) and world is not None
                and world.bound_device_id is not None)

    def expect(self, condition: bool, what: str, expected: Any, observed: Any) -> None:
        """Fail naming this rank, what was checked, the expected and the observed values."""
        if not condition:
            raise CheckFailed(f"rank {self.rank}: {what}: expected {expected!r}, observed {observed!r}")

    def expect_equal(self, what: str, expected: Any, observed: Any) -> None:
        """expect(expected == observed)."""
        self.expect(expected == observed, what, expected, observed)

    def note(self, text: str) -> None:
        """A finding to carry into the report even when the check passes."""
        self.notes.append(f"rank {self.rank}: {text}")
