"""The narrowest shim that lets torch's own front end bind, split and new_group a simulator world.

``bind_device`` binds a world to ``cpu:0``; ``install()`` patches, per torch version, only the front-end steps
that gate a path behind an accelerator (the binding backport, ``_get_split_source``, ``split_group``,
``batch_isend_irecv`` before 2.14; simulator/README.md, "The binding and the shim", says why each) and
``uninstall()`` restores every original through one undo stack (``simulator.patches.Patches``). It cannot see
groups of other backends: their splits and new_groups run torch untouched.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from packaging.version import Version
from torch._C._distributed_c10d import Backend as C10dBackend

from simulator import batch
from simulator.patches import Patches

BOUND_DEVICE = torch.device("cpu", 0)
TORCH = Version(Version(torch.__version__).base_version)
#: torch < 2.15 refuses a cpu device_id in _new_process_group_helper (v2.13.0 distributed_c10d.py:2014).
REFUSES_CPU_DEVICE_ID = Version("2.15") > TORCH
#: torch >= 2.14 hands the split source to the creator as a c10d Backend (v2.15.0 distributed_c10d.py:3119).
SPLIT_FROM_IN_OPTIONS = hasattr(c10d._DistributedBackendOptions, "split_from")
#: torch < 2.14 hands a Python group's batch_isend_irecv over op by op (v2.13.0 distributed_c10d.py:3049).
SPLITS_PYTHON_BATCHES = Version("2.14") > TORCH

_installed = Patches()  # what install() replaced, undone by uninstall()
_virtual = threading.local()  # depth of virtual_accelerator blocks on this thread
_accelerator = Patches()  # the thread-aware torch.accelerator answers, while any virtual_accelerator block is open
_accelerator_users = [0]  # open virtual_accelerator blocks, on every thread
_accelerator_lock = threading.Lock()


def virtual_device() -> torch.device:
    """The device a simulator world is bound to: ``cpu:0`` (where its data lives)."""
    return BOUND_DEVICE


def bind_device(pg: dist.ProcessGroup, device: torch.device | None = None) -> None:
    """Bind ``pg`` to ``device`` (default ``cpu:0``) and create its communicator eagerly."""
    device = device or virtual_device()
    pg.bound_device_id = device
    pg.eager_connect_single_device(device)


class SplitSource(C10dBackend):
    """What torch's new_group splits from in a bound simulator world: a c10d Backend handle.

    torch keeps it in ``_DistributedBackendOptions.split_from`` (members) and calls its
    ``perform_nocolor_split`` (non-members); both reach the simulator's group.
    """

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__(group.rank(), group.size())
        self.group = group

    @property
    def supports_splitting(self) -> bool:
        """The simulator's communicators split."""
        return True

    def perform_nocolor_split(self, device: Any) -> None:
        """Take part in the parent's split as a non-member."""
        self.group.perform_nocolor_split(device)

    def eager_connect_single_device(self, device: Any) -> None:
        """Create the parent's communicator now."""
        self.group.eager_connect_single_device(device)


def _on_this_thread(original: Callable[..., Any], virtual: Callable[..., Any]) -> Callable[..., Any]:
    """``virtual`` inside a virtual_accelerator block of the calling thread, else ``original``."""

    @functools.wraps(original)
    def answer(*args: Any, **kwargs: Any) -> Any:
        return (virtual if getattr(_virtual, "depth", 0) else original)(*args, **kwargs)

    return answer


@contextlib.contextmanager
def virtual_accelerator() -> Iterator[None]:
    """Make torch believe the CPU is the current accelerator, on the calling thread, for the duration of the block.

    The thread-aware answers are put on ``torch.accelerator`` by the first block to enter (on any thread) and
    taken off by the last to leave, so blocks on different threads never undo each other.
    """
    with _accelerator_lock:
        if not _accelerator_users[0]:
            _accelerator.wrap(torch.accelerator, "is_available",
                              lambda original: _on_this_thread(original, lambda: True))
            _accelerator.wrap(torch.accelerator, "current_accelerator",
                              lambda original: _on_this_thread(original, lambda *a, **k: torch.device("cpu")))
        _accelerator_users[0] += 1
    _virtual.depth = getattr(_virtual, "depth", 0) + 1
    try:
        yield
    finally:
        _virtual.depth -= 1
        with _accelerator_lock:
            _accelerator_users[0] -= 1
            if not _accelerator_users[0]:
                _accelerator.undo()


def _is_sim(pg: Any) -> bool:
    from simulator.backend import SimProcessGroup

    return isinstance(pg, SimProcessGroup)


@contextlib.contextmanager
def cpu_device_types(cls: type) -> Iterator[None]:
    """Groups of the Python ProcessGroup class ``cls`` report a cpu backend; torch's flight-recorder
    attach still skips them.

    torch 2.15's split_group finds the parent's backend through ``_device_types`` (v2.15.0
    distributed_c10d.py:6866), empty for a Python ProcessGroup; torch skips such a group in the
    flight-recorder attach by that same emptiness (v2.15.0 :2924): its C++ side cannot record it.
    """
    with Patches() as patches:
        patches.replace(cls, "_device_types", [torch.device("cpu")])
        if hasattr(c10d, "_maybe_attach_flight_recorder"):
            patches.wrap(c10d, "_maybe_attach_flight_recorder", lambda attach: functools.wraps(attach)(
                lambda pg, *args, **kwargs: None if isinstance(pg, cls) else attach(pg, *args, **kwargs)))
        yield


def _split_group(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not dist.is_initialized():
        return original(*args, **kwargs)
    default = c10d._get_default_group()
    parent = kwargs.get("parent_pg", args[0] if args else None) or default
    if not _is_sim(parent):
        return original(*args, **kwargs)
    with contextlib.ExitStack() as stack:
        if default.bound_device_id is None and parent.splits_unbound():
            default.bound_device_id = virtual_device()
            stack.callback(setattr, default, "bound_device_id", None)
        stack.enter_context(virtual_accelerator())
        stack.enter_context(cpu_device_types(type(parent)))
        return original(*args, **kwargs)


def _new_group(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """new_group, refused at once on the members of a members-only group (``use_local_synchronization=True``)
    that would be split from a bound simulator world: the split needs every rank of the world, and the others
    never call, so the members would wait out the timeout (what NCCL does: it hangs). A group of another simulator
    backend is not split from the world, so it is let through, but where torch makes every new_group through
    split_group (``new_group_via_split``: the torchcomms routing before 2.15); so is one whose communicator is a
    fresh one among its members (``new_group_splits`` false: the torchcomms routing from 2.15)."""
    bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
    ranks, backend = bound.get("ranks"), bound.get("backend")
    if bound.get("use_local_synchronization") and ranks is not None and dist.is_initialized():
        default = c10d._get_default_group()
        if (_is_sim(default) and default.bound_device_id is not None and dist.get_rank() in ranks
                and (default.new_group_via_split or (
                    default.new_group_splits
                    and (backend is None or str(backend).split(":")[-1] == default.getBackendName())))):
            default.refuse_local_synchronization(sorted(ranks))
    return original(*args, **kwargs)


def _python_split_source(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """torch's split source, a c10d Backend handle where it is a Python ProcessGroup."""
    source = original(*args, **kwargs)
    return SplitSource(source) if isinstance(source, dist.ProcessGroup) else source


def _sim_split_source(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    source = original(*args, **kwargs)
    return SplitSource(source) if _is_sim(source) else source


def _bind_cpu_device_id(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """torch 2.15's handling of a cpu ``device_id`` for torch < 2.15: create unbound, then bind and connect.

    torch binds the group it built (v2.15.0 distributed_c10d.py:3054, v2.13.0 :2096) and then, where the creator
    returned a ProcessGroup of its own (a Python backend), uses that one instead (v2.15.0 :3130-3131, v2.13.0
    :2278-2279): a subgroup's binding is then what the backend gave it, so it is left as the backend set it. The
    world is bound here all the same: torch 2.15 hands the bound group to the creator (``process_group``, :3118),
    which torch 2.13 cannot do."""
    device = kwargs.get("device_id")
    if device is None or device.type != "cpu":
        return original(*args, **kwargs)
    world = c10d._world.default_pg is None
    pg, store = original(*args, **{**kwargs, "device_id": None})
    if isinstance(pg, dist.ProcessGroup):
        if world or type(pg) is dist.ProcessGroup:
            pg.bound_device_id = device
        backend = pg._get_backend(device)
        if backend.supports_splitting:
            backend.eager_connect_single_device(device)
    return pg, store


def _wrapper(wrapper: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``make(original)`` for Patches.wrap: ``wrapper(original, *args, **kwargs)``, looking like the original."""
    return lambda original: functools.wraps(original)(functools.partial(wrapper, original))


@contextlib.contextmanager
def python_backend_binding() -> Iterator[None]:
    """For another Python ProcessGroup backend bound to ``cpu:0`` (a CPU vendor declaring device_binding):
    while active, new_group passes the cpu binding on (torch < 2.15) and splits from the group (torch >= 2.14),
    as ``install`` does for the simulator."""
    with Patches() as patches:
        if REFUSES_CPU_DEVICE_ID:
            patches.wrap(c10d, "_new_process_group_helper", _wrapper(_bind_cpu_device_id))
        if SPLIT_FROM_IN_OPTIONS:
            patches.wrap(c10d, "_get_split_source", _wrapper(_python_split_source))
        yield


def install() -> None:
    """Install the wrappers this torch needs (idempotent)."""
    if _installed:
        return
    _installed.wrap(c10d, "split_group", _wrapper(_split_group))
    _installed.replace(dist, "split_group", c10d.split_group)
    _installed.wrap(c10d, "new_group", _wrapper(_new_group))
    _installed.replace(dist, "new_group", c10d.new_group)
    if SPLIT_FROM_IN_OPTIONS:
        _installed.wrap(c10d, "_get_split_source", _wrapper(_sim_split_source))
    if REFUSES_CPU_DEVICE_ID:
        _installed.wrap(c10d, "_new_process_group_helper", _wrapper(_bind_cpu_device_id))
    if SPLITS_PYTHON_BATCHES:
        _installed.wrap(c10d, "batch_isend_irecv", _wrapper(batch.coalesce_sim_batches))
        _installed.replace(dist, "batch_isend_irecv", c10d.batch_isend_irecv)


def uninstall() -> None:
    """Restore torch's functions."""
    _installed.undo()
