"""Communicator creation seen through the creator a backend registered with torch.

An out-of-tree backend registers ``Backend.register_backend(name, creator, ...)``; torch calls
that creator once for the world and once per ``new_group`` the rank is a member of, with the
group's store, rank, size, name and (extended API) global ranks. ``CreatorProbe.install``
wraps the registered creator (torch's ``Backend._plugins`` entry) and records one
``comm_created`` per call: the group name, the members (global ranks), the device type the
creator serves, and the mode: the world's init mode (``eager`` when torch bound a device)
for the world, None for other groups (the creator does not say whether the backend split
them from a parent).

Measured (torch 2.13 CPU, toyccl): one event at ``init_process_group``, one per ``new_group``
on members, none on non-members; groups made by ``split_group`` are made by the parent
backend's ``split_group`` method, not the creator, and are invisible here. gloo and NCCL are
built in (no registered creator): nothing.

Cannot see: splits, lazily created internal communicators (per-pair P2P), config.
Positive control: the world's own creation; ``control_missing("comm_created")`` says when it
was not seen on this rank.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.distributed as dist

from conformance.probes.base import RecordingProbe


class CreatorProbe(RecordingProbe):
    """``comm_created`` events from calls to a registered backend's creator."""

    observes = frozenset({"comm_created"})

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend
        self._original: Any = None

    def install(self) -> CreatorProbe:
        """Wrap the creator registered for ``backend`` (a no-op when none is registered)."""
        plugins = dist.Backend._plugins
        key = self.backend.upper()
        if self._original is not None or key not in plugins:
            return self
        plugin = plugins[key]
        self._original = plugin
        plugins[key] = plugin._replace(creator_fn=self._wrap(plugin.creator_fn, plugin.extended_api))
        return self

    def _wrap(self, creator: Any, extended: bool) -> Any:
        probe = self

        @functools.wraps(creator)
        def create(*args: Any) -> Any:
            world = not dist.is_initialized()
            if extended:
                common = args[0]
                size, name = common.group_size, common.group_id
                members = sorted(common.global_ranks_in_group) or list(range(size))
            else:
                size, name, members = args[2], None, list(range(args[2])) if world else None
            event = probe.record("comm_created", comm=name or f"world{len(probe._events)}", group=name,
                                 members=members, parent=None, mode="lazy" if world else None, device=None,
                                 config=None, backend=probe.backend)
            backend = creator(*args)
            event["world"] = world
            return backend

        return create

    def flush(self) -> None:
        """The world's mode becomes eager once torch has bound it to a device."""
        worlds = [e for e in self._events if e.get("world")]
        if worlds and dist.is_initialized() and dist.distributed_c10d._get_default_group().bound_device_id is not None:
            worlds[-1]["mode"] = "eager"

    def close(self) -> None:
        """Put the original creator back."""
        if self._original is not None and self.backend.upper() in dist.Backend._plugins:
            dist.Backend._plugins[self.backend.upper()] = self._original
        self._original = None
