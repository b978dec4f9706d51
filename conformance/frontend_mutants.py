"""Front-end mutants: defective versions of torch.distributed front-end functions.

Some requirements are decided by torch's own front end before any backend is reached (backend
string parsing, split_group filters, creator arguments, batch validation). No backend defect can
show that their checks have teeth, so the defect matrix swaps in one of these defective versions
(named by ``CONFORMANCE_FRONTEND_MUTANT`` in a check's environment) for the duration of one check.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

ENV = "CONFORMANCE_FRONTEND_MUTANT"


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    return lambda: setattr(owner, name, original)


def _malformed_accepted() -> list[Callable[[], None]]:
    def make(original: Any) -> Any:
        def init(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(backend, *args, **kwargs)
            except (ValueError, RuntimeError, AssertionError):
                return original("cpu:gloo", *args, **kwargs)

        return init

    return [_patch(dist, "init_process_group", make), _patch(c10d, "init_process_group", make)]


def _filter_ignored() -> list[Callable[[], None]]:
    def make(original: Any) -> Any:
        def split_group(*args: Any, backend: Any = None, **kwargs: Any) -> Any:
            return original(*args, **kwargs)

        return split_group

    return [_patch(dist, "split_group", make), _patch(c10d, "split_group", make)]


def _creator_options_copied() -> list[Callable[[], None]]:
    def make(original: Any) -> Any:
        def register(name: str, func: Any, extended_api: bool = False, devices: Any = None) -> None:
            if extended_api:
                inner = func

                def func(common: Any, options: Any) -> Any:
                    return inner(common, copy.copy(options))

            return original(name, func, extended_api, devices)

        return register

    return [_patch(dist.Backend, "register_backend", lambda original: staticmethod(make(original)))]


def _empty_batch_accepted() -> list[Callable[[], None]]:
    def make(original: Any) -> Any:
        return lambda ops: [] if not ops else original(ops)

    return [_patch(dist, "batch_isend_irecv", make)]


def _mixed_types_swallowed() -> list[Callable[[], None]]:
    def make(original: Any) -> Any:
        @contextlib.contextmanager
        def manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with contextlib.suppress(RuntimeError), original(*args, **kwargs) as cm:
                yield cm

        return manager

    return [_patch(dist, "_coalescing_manager", make)]


MUTANTS: dict[str, tuple[str, Callable[[], list[Callable[[], None]]]]] = {
    "frontend_malformed_accepted": ("a malformed backend string silently falls back to cpu:gloo",
                                    _malformed_accepted),
    "frontend_filter_ignored": ("split_group ignores its backend filter", _filter_ignored),
    "frontend_creator_options_copied": ("the creator receives a copy of pg_options, not the caller's object",
                                        _creator_options_copied),
    "frontend_empty_batch_accepted": ("batch_isend_irecv([]) returns [] instead of refusing", _empty_batch_accepted),
    "frontend_mixed_types_swallowed": ("a coalescing block of mixed op types is dropped without an error",
                                       _mixed_types_swallowed),
}


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Apply the named mutant (none if ``name`` is empty) for the duration of the block."""
    if not name:
        yield
        return
    if name not in MUTANTS:
        raise KeyError(f"unknown front-end mutant {name!r}; known: {sorted(MUTANTS)}")
    undo = MUTANTS[name][1]()
    try:
        yield
    finally:
        for step in reversed(undo):
            step()
