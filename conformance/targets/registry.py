"""Find targets by name: the built-in ones, and vendors' through the `conformance.targets` entry points.

A target is one file and one registration line: a module with a ``Target`` subclass (and its
``Driver``, see conformance.targets.base), registered in-tree by a line in ``BUILTIN``, or from any
installed package by one entry point in the group ``conformance.targets`` (``name = "module:Class"``,
as examples/toyccl/pyproject.toml does).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from conformance.targets.base import Target

BUILTIN: dict[str, str] = {
    "sim": "conformance.targets.sim:SimTarget",
    "gloo": "conformance.targets.gloo:GlooTarget",
    "nccl": "conformance.targets.nccl:NcclTarget",
    "torchcomms": "conformance.targets.torchcomms:TorchcommsTarget",
    "vendor": "conformance.targets.vendor:VendorTarget",
}


def _load(path: str) -> type[Target]:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _plugins() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group="conformance.targets")}


def available_targets() -> list[str]:
    """Names of every target: built-in first, then those vendors' packages declare."""
    return [n for n in BUILTIN if n != "vendor"] + sorted(set(_plugins()) - set(BUILTIN))


def target_class(name: str) -> type[Target]:
    """The class of target ``name`` (its class attributes, e.g. ``gpu``, without instantiating it)."""
    path = BUILTIN.get(name) or _plugins().get(name)
    if path is None:
        raise ValueError(f"unknown target {name!r}; known targets: {', '.join(available_targets())}")
    return _load(path)


def make_target(name: str, options: dict[str, Any] | None = None) -> Target:
    """The description of target ``name`` with keyword ``options`` (``.driver()`` is its rank side);
    unknown names list the known ones."""
    return target_class(name)(**(options or {}))
