"""Communicator creation read off the bootstrap keys a backend (gloo) writes to the c10d store torch hands
it: ``RecordingStore`` wraps the store, ``StoreProbe`` turns a new group prefix's mesh into ``comm_created``.

What was measured: conformance/probes/README.md ("Communicator creation through the store"). It cannot see
communicators made without the store, their creation mode or parent, or config. Positive control: the
world's own mesh.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from conformance.probes.base import RecordingProbe

# <group path>/<device type>//<device index>/<group rank>, as gloo writes its mesh addresses.
MESH_KEY = re.compile(r"^(?P<path>.+?)/+(?P<device>[a-z]+)//(?P<index>\d+)/(?P<rank>\d+)$")


class StoreProbe(RecordingProbe):
    """``comm_created`` events from mesh-bootstrap keys seen by a RecordingStore."""

    observes = frozenset({"comm_created"})

    def __init__(self) -> None:
        super().__init__()
        self._pending: dict[str, dict[str, Any]] = {}
        self._store: RecordingStore | None = None

    def attach_store(self, store: dist.Store) -> dist.Store:
        """A RecordingStore over ``store``, kept here: torch keeps only its C++ half alive."""
        self._store = RecordingStore(store, self)
        return self._store

    def close(self) -> None:
        """Let go of the store."""
        self._store = None

    def saw_key(self, op: str, key: str) -> None:
        """Called by RecordingStore for every key this rank sets or reads."""
        m = MESH_KEY.match(key)
        if m is None:
            return
        path, rank = m["path"], int(m["rank"])
        if op == "set" and path not in self._pending:
            event = self.record("comm_created", comm=path, group=re.split(r"/+", path)[-1], members=None,
                                parent=None, mode=None, device=m["device"], config=None, backend=None)
            self._pending[path] = {"event": event, "ranks": set()}
        if path in self._pending:
            self._pending[path]["ranks"].add(rank)

    def flush(self) -> None:
        """Map each pending group's ranks to global ranks once torch has registered the group."""
        if not dist.is_initialized():
            return
        world = dist.distributed_c10d._get_default_group()
        by_name = {pg.group_name: pg for pg in dist.distributed_c10d._world.pg_map}
        for path, entry in list(self._pending.items()):
            event = entry["event"]
            pg = by_name.get(event["group"])
            if pg is None:
                continue
            ranks = dist.get_process_group_ranks(pg)
            event["members"] = sorted(ranks[r] for r in entry["ranks"] if r < len(ranks))
            if pg is world:
                event["mode"] = "eager" if world.bound_device_id is not None else "lazy"
            if len(entry["ranks"]) == len(ranks):
                del self._pending[path]


class RecordingStore(dist.Store):
    """A store that forwards every call to ``inner`` and reports keys to a StoreProbe.

    Whoever hands it to torch must keep a reference until the groups are destroyed: torch holds
    only the C++ half, and once Python collects the wrapper every call from C++ fails with
    torch's "Not implemented" assert (seen on torch 2.13 when a check's later new_group used it).
    """

    def __init__(self, inner: dist.Store, probe: StoreProbe) -> None:
        super().__init__()
        self._inner, self._probe = inner, probe
        self._clones: list[RecordingStore] = []

    def set(self, key: str, value: Any) -> None:
        self._probe.saw_key("set", key)
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        self._probe.saw_key("get", key)
        return self._inner.get(key)

    def add(self, key: str, value: int) -> int:
        return self._inner.add(key, value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._inner.compare_set(key, expected, desired)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)

    def num_keys(self) -> int:
        return self._inner.num_keys()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        for key in keys:
            self._probe.saw_key("get", key)
        return self._inner.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        for key in keys:
            self._probe.saw_key("set", key)
        self._inner.multi_set(keys, values)

    def append(self, key: str, value: Any) -> None:
        self._inner.append(key, value)

    def has_extended_api(self) -> bool:
        return self._inner.has_extended_api()

    def clone(self) -> RecordingStore:
        """A recording clone (gloo clones the store for its own threads)."""
        clone = RecordingStore(self._inner.clone(), self._probe)
        self._clones.append(clone)  # kept alive with this store, as torch needs
        return clone

    def list_keys(self) -> list[str]:
        return self._inner.list_keys()

    def queue_push(self, key: str, value: Any) -> None:
        self._inner.queue_push(key, value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        return self._inner.queue_pop(key, block)

    def queue_len(self, key: str) -> int:
        return self._inner.queue_len(key)

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)

    @property
    def timeout(self) -> timedelta:
        return self._inner.timeout
