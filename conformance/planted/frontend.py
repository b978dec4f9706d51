"""Front-end mutants: defective versions of torch.distributed front-end functions.

Some requirements are decided by torch's own front end before any backend is reached (backend
string parsing, split_group filters, creator arguments, batch validation). No backend defect can
show that their checks have teeth, so the defect matrix swaps in one of these defective versions
for the duration of one check (``conformance.planted.task``), through a ``simulator.patches.Patches``.

The last two patch the simulator's own classes instead, for API surfaces no simulator switch reaches (what
destroying a group releases, the list form of gather); the mutation run found both unguarded.

``record_reached`` wraps, in a clean run, every attribute a mutant would replace with a recorder that calls
the original: a check that never calls any of them cannot be changed by that mutant (the matrix's plan).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from simulator.patches import Patches


def _malformed_accepted(patches: Patches) -> None:
    def make(original: Any) -> Any:
        def init(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(backend, *args, **kwargs)
            except (ValueError, RuntimeError, AssertionError):
                return original("cpu:gloo", *args, **kwargs)

        return init

    patches.wrap(dist, "init_process_group", make)
    patches.wrap(c10d, "init_process_group", make)


def _filter_ignored(patches: Patches) -> None:
    def make(original: Any) -> Any:
        def split_group(*args: Any, backend: Any = None, **kwargs: Any) -> Any:
            return original(*args, **kwargs)

        return split_group

    patches.wrap(dist, "split_group", make)
    patches.wrap(c10d, "split_group", make)


def _creator_options_copied(patches: Patches) -> None:
    def make(original: Any) -> Any:
        def register(name: str, func: Any, extended_api: bool = False, devices: Any = None) -> None:
            if extended_api:
                inner = func

                def func(common: Any, options: Any) -> Any:
                    return inner(common, copy.copy(options))

            return original(name, func, extended_api, devices)

        return staticmethod(register)

    patches.wrap(dist.Backend, "register_backend", make)


def _empty_batch_accepted(patches: Patches) -> None:
    patches.wrap(dist, "batch_isend_irecv", lambda original: lambda ops: [] if not ops else original(ops))


def _mixed_types_swallowed(patches: Patches) -> None:
    def make(original: Any) -> Any:
        @contextlib.contextmanager
        def manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with contextlib.suppress(RuntimeError), original(*args, **kwargs) as cm:
                yield cm

        return manager

    patches.wrap(dist, "_coalescing_manager", make)


def _destroy_keeps_comms(patches: Patches) -> None:
    from simulator.backend import SimProcessGroup

    patches.wrap(SimProcessGroup, "shutdown", lambda original: lambda self: None)


def _gather_reversed(patches: Patches) -> None:
    from simulator.collectives import ListCollectives

    patches.wrap(ListCollectives, "gather",
                 lambda original: lambda self, outputs, *args: original(self, outputs[::-1], *args))


class _Reached:
    """Stands in for ``Patches`` while one mutant's planting function runs in a clean check: each attribute the
    mutant would replace is wrapped instead to add the mutant's name to ``seen`` when called, then run the
    original (the mutant's own replacement is never made)."""

    def __init__(self, name: str, seen: set[str], patches: Patches) -> None:
        self.name, self.seen, self.patches = name, seen, patches

    def wrap(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def reached(*args: Any, **kwargs: Any) -> Any:
            self.seen.add(self.name)
            return original(*args, **kwargs)

        is_static = isinstance(vars(owner).get(attr), staticmethod)
        self.patches.replace(owner, attr, staticmethod(reached) if is_static else reached)


def record_reached(patches: Patches, seen: set[str]) -> None:
    """Until ``patches`` is undone, add to ``seen`` the name of each mutant whose replaced functions are called."""
    for name, (_, plant) in MUTANTS.items():
        plant(_Reached(name, seen, patches))  # type: ignore[arg-type]


MUTANTS: dict[str, tuple[str, Callable[[Patches], None]]] = {
    "frontend_malformed_accepted": ("a malformed backend string silently falls back to cpu:gloo",
                                    _malformed_accepted),
    "frontend_filter_ignored": ("split_group ignores its backend filter", _filter_ignored),
    "frontend_creator_options_copied": ("the creator receives a copy of pg_options, not the caller's object",
                                        _creator_options_copied),
    "frontend_empty_batch_accepted": ("batch_isend_irecv([]) returns [] instead of refusing", _empty_batch_accepted),
    "frontend_mixed_types_swallowed": ("a coalescing block of mixed op types is dropped without an error",
                                       _mixed_types_swallowed),
    "destroy_keeps_comms": ("destroying a group leaves its communicators alive", _destroy_keeps_comms),
    "gather_reversed": ("gather (list form) fills the root's list in reverse rank order", _gather_reversed),
}
