"""The communicator model: id, members, parent, config, creation mode, streams, data fabric."""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from simulator import timeouts
from simulator.control import Boot
from simulator.errors import RankTimeout
from simulator.events import LOG
from simulator.fabric import Fabric
from simulator.parts import REFERENCE, Parts
from simulator.stream import Stream

MAIN_STREAM = "main"
# The setting that names the simulator's /dev/shm segments: whoever starts rank processes may set this
# environment variable to a prefix of its own, and after killing them remove what is left with
# ``simulator.shm.sweep(prefix)``. Unset, each world picks a prefix of its own.
SHM_PREFIX_ENV = "SIM_SHM_PREFIX"


UID_KEY = "sim_world_uid"


def world_namespace(store: dist.Store, rank: int) -> tuple[str, str]:
    """(shm name prefix, store key namespace) every rank of a world agrees on.

    The shm prefix is ``SHM_PREFIX_ENV``'s when it is set, so that whoever set it can sweep
    leftovers after a crash. The namespace keeps the simulator's keys apart from other worlds'
    on a shared store server. Every rank proposes a uid and the first to arrive claims the key
    (``compare_set``: one round trip, and no rank waits for another); the world's rank 0 deletes
    the key once every member has read it (:func:`release_namespace`), so that a later world on the
    same store claims a fresh one.
    """
    mine = f"{os.getpid()}_{time.monotonic_ns() % 10**9}"
    try:
        uid = store.compare_set(UID_KEY, "", mine).decode()
    except (RuntimeError, NotImplementedError, AttributeError):  # a store without compare_set
        if rank == 0:
            store.set(UID_KEY, mine)
        uid = mine if rank == 0 else store.get(UID_KEY).decode()
    return os.environ.get(SHM_PREFIX_ENV) or f"sim{uid}_", f"sim/{uid}/"


def release_namespace(store: dist.Store) -> None:
    """Delete the world's uid key (rank 0, once every member has read it: after the world communicator's
    boot rendezvous, or when the world is destroyed, since every member read it when it created its world
    group, before any collective with rank 0 could complete)."""
    with contextlib.suppress(RuntimeError, NotImplementedError, AttributeError):  # a store without delete_key
        store.delete_key(UID_KEY)


_hosting: weakref.WeakKeyDictionary[dist.Store, bool] = weakref.WeakKeyDictionary()


def hosts_store(store: dist.Store | None) -> bool:
    """Whether this process hosts ``store``'s TCPStore server: one of its own sockets listens on the store's
    port. Only this process's fds are looked at (the host-wide /proc/net/tcp took 40 ms to read with a few
    hundred sockets in TIME_WAIT, on every rank's teardown), once per store object (whether it is the
    server's is fixed when it is made)."""
    if not isinstance(store, dist.TCPStore):
        return False
    known = _hosting.get(store)
    if known is None:
        known = _hosting[store] = _listens_on(store.port)
    return known


def _listens_on(port: int) -> bool:
    fds = os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ()
    for fd in map(int, fds):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:  # an fd another thread closed meanwhile
            continue
        try:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            name = sock.getsockname() if listening else None
        except OSError:
            name = None
        finally:
            sock.detach()  # the fd stays the owner's
        if isinstance(name, tuple) and name[1] == port:
            return True
    return False


def plain_copy(value: Any) -> Any:
    """A deep copy of ``value``: dicts, lists and scalars copied directly (a config is plain data, and this
    runs for every communicator), anything else through copy.deepcopy."""
    if isinstance(value, dict):
        return {k: plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_copy(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return copy.deepcopy(value)


def root_store(store: dist.Store) -> dist.Store | None:
    """The store under every PrefixStore of ``store`` (what per-thread connections are cloned from)."""
    root = getattr(store, "_underlying_non_prefix_store", None)
    return root if isinstance(root, dist.TCPStore) else None


def rendezvous(store: dist.Store, key: str, rank: int, members: list[int], timeout_s: float, what: str,
               value: str | None = None) -> list[bytes] | None:
    """Post this rank's arrival under ``key`` and wait for every member; name the absent ones. With ``value``,
    each rank posts that as its arrival, and every member's is returned, in ``members``' order: on a TCPStore
    one round trip does both, since its ``multi_get`` waits for its keys (for the store's timeout, which is
    ``timeout_s`` meanwhile)."""
    store.set(f"{key}/{rank}", b"1" if value is None else value)
    keys = [f"{key}/{r}" for r in members]
    try:
        if value is None:
            arrived = timeouts.wait_keys(store, keys, timeout_s)
        else:
            return _get_waiting(store, keys, timeout_s)
    except dist.DistStoreError:
        arrived = False
    if not arrived:
        missing = [r for r, k in zip(members, keys) if not store.check([k])]
        raise RankTimeout(f"rank {rank}: " + timeouts.message(
            what, timeout_s, f"ranks {missing} never arrived (members {members})"))
    return None


def _get_waiting(store: dist.Store, keys: list[str], timeout_s: float) -> list[bytes]:
    """``keys``' values once every one exists, waiting at most ``timeout_s`` (DistStoreError after that)."""
    root = getattr(store, "_underlying_non_prefix_store", store)
    if isinstance(root, dist.TCPStore):
        before = root.timeout
        root.set_timeout(timedelta(seconds=timeout_s))
        try:
            return store.multi_get(keys)
        finally:
            root.set_timeout(before)
    if not timeouts.wait_keys(store, keys, timeout_s):
        raise dist.DistStoreError("wait timeout")
    return store.multi_get(keys)


@dataclass
class Communicator:
    """One simulated NCCL communicator on this rank."""

    id: str
    members: list[int]
    rank: int
    mode: str
    config: dict[str, Any]
    store: dist.Store
    timeout_s: float
    prefix: str
    root: dist.Store | None = None
    namespace: str = ""
    parent: str | None = None
    device: str | None = None
    split_count: int = 0
    streams: dict[str, Stream] = field(default_factory=dict)
    fabric: Fabric | None = None
    recorded: bool = True
    parts: Parts = REFERENCE
    boot: Boot | None = field(default=None, repr=False)  # from the rendezvous that created it, if any

    def retime(self, timeout_s: float) -> None:
        """Give this communicator its group's timeout: a split child is made by its parent's group, whose
        timeout it would keep (as ProcessGroupNCCL does, a group's ops time out after its own timeout)."""
        self.timeout_s = timeout_s
        if self.fabric is not None:
            self.fabric.control.timeout_s = timeout_s

    def __post_init__(self) -> None:
        self.fabric = self.parts.fabric(
            dist.PrefixStore(f"comm/{self.id}/", self.store),
            self.id,
            self.members,
            self.rank,
            self.timeout_s,
            self.prefix,
            root=self.root,
            prefixes=(self.namespace, f"comm/{self.id}/"),
            kernel=self.parts.kernel,
            p2p=self.parts.p2p,
            boot=self.boot,
        )
        self.boot = None
        if not self.recorded:  # only the p2p_pair_comm_unlogged defect creates unrecorded communicators
            return
        LOG.record(
            "comm_created",
            comm=self.id,
            members=list(self.members),
            parent=self.parent,
            mode=self.mode,
            device=self.device,
            config=plain_copy(self.config),
            backend="sim",
        )
        LOG.record("config_applied", comm=self.id, config=plain_copy(self.config))

    def local(self, global_rank: int) -> int:
        """The member index of ``global_rank`` in this communicator."""
        return self.members.index(global_rank)

    def launch(self, op: str, fn: Callable[[Fabric], Any], *, stream: str = MAIN_STREAM, ops: int = 1,
               coalesced: bool = False) -> torch.futures.Future:
        """Record one launch of ``ops`` ops on ``stream`` and run ``fn(fabric)`` there."""
        LOG.record("launch", comm=self.id, op=op, ops=ops, stream=stream, device="cpu", backend="sim",
                   coalesced=coalesced)
        if stream not in self.streams:
            self.streams[stream] = Stream(f"{self.id}:{stream}")
        fabric = self.fabric

        def run() -> Any:
            with torch.no_grad():  # grad mode is per thread, on in a stream's; a backend writes tensors as data
                return fn(fabric)

        return self.streams[stream].submit(run)

    def destroy(self) -> None:
        """Drain streams, release shared memory, record the destruction."""
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()
        if self.fabric is not None:
            self.fabric.close()
            self.fabric = None
        LOG.record("comm_destroyed", comm=self.id)
