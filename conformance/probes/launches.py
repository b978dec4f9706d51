"""Launches seen from outside the backend: one ``launch`` event per front-end call into it, from torch's
dispatcher (C++ backends) or from the Python backend class's own methods (``watch_class``).

What was measured on gloo, toyccl and the simulator: conformance/probes/README.md ("Launches"). It cannot see
calls made on other threads, the backend's kernels or streams, which communicator ran a launch beyond the
group's name, or ops a C++ backend runs without being called. Positive control: a launch of the check's own
traffic.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.probes.base import RecordingProbe

# Methods torch's front end calls on a Python ProcessGroup subclass, and the op each is.
PY_METHODS: dict[str, str] = {
    "allreduce": "allreduce", "allreduce_coalesced": "allreduce", "allgather": "allgather",
    "all_gather_single": "allgather", "all_gather_single_coalesced": "allgather",
    "_allgather_base": "allgather", "allgather_into_tensor_coalesced": "allgather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_single_coalesced": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "broadcast": "broadcast", "reduce": "reduce",
    "barrier": "barrier", "alltoall_base": "alltoall", "all_to_all_single": "alltoall", "send": "send",
    "recv": "recv", "recv_anysource": "recv",
}


def op_name(dispatcher_op: str) -> str:
    """``c10d.allreduce_coalesced_.default`` -> ``allreduce``; ``c10d.recv_any_source_`` -> ``recv``."""
    name = dispatcher_op.split(".")[1].strip("_")
    for suffix in ("_coalesced", "_any_source", "_base", "_into_tensor"):
        name = name.replace(suffix, "")
    return {"_allgather": "allgather", "allgather": "allgather"}.get(name, name)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _count(value: Any) -> int:
    """Ops in one launch: the length of its first (tensor-list) argument, 1 for a single tensor."""
    return len(value) if isinstance(value, (list, tuple)) else 1


def _group(value: Any) -> dist.ProcessGroup | None:
    try:
        return dist.ProcessGroup.unbox(value)
    except Exception:  # noqa: BLE001 - not a boxed process group
        return None


def _python_group_name(pg: Any) -> str | None:
    """The group's own ``group_name``, else the name torch gave it (c10d's ``_world.pg_names``).

    C++ ``ProcessGroup::getGroupName`` reads the name off the group's registered backends, and torch
    registers none for a Python ProcessGroup subclass (v2.13.0 distributed_c10d.py:2278-2280 returns the
    subclass as the group), so unless the subclass overrides it, ``group_name`` raises "ProcessGroup name
    not set" (measured on a gloo-wrapping subclass, torch 2.13). The launch is the backend's either way.
    """
    try:
        return pg.group_name or None
    except RuntimeError:
        return dist.distributed_c10d._world.pg_names.get(pg) or None


class _Dispatch(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: keep torch from wrapping ``__torch_dispatch__`` in ``torch._disable_dynamo``
        (TorchDispatchMode.__init_subclass__, torch/utils/_python_dispatch.py, v2.11 to v2.15), whose first
        call imports torch._dynamo: about 1 s of CPU in every rank process a pool forks. This mode only
        forwards each op after noting c10d ones; nothing compiles under it."""
        return False

    def __init__(self, seen: Callable[[str, tuple, dict], None]) -> None:
        super().__init__()
        self._seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if getattr(func, "namespace", "") == "c10d":
            self._seen(str(func), args, kwargs or {})
        return func(*args, **(kwargs or {}))


class LaunchProbe(RecordingProbe):
    """``launch`` events from the dispatcher (C++ backends) and from wrapped Python backend classes."""

    observes = frozenset({"launch"})

    def __init__(self) -> None:
        super().__init__()
        self._mode: _Dispatch | None = None
        self._wrapped: list[tuple[type, str, Any]] = []
        self._depth = threading.local()

    def start(self) -> LaunchProbe:
        """Start watching the dispatcher on this thread."""
        if self._mode is None:
            self._mode = _Dispatch(self._from_dispatcher)
            self._mode.__enter__()
        return self

    def _from_dispatcher(self, func: str, args: tuple, kwargs: dict) -> None:
        with self.boundary("launch"):  # a fault here is the suite's, never the backend's call's
            groups = [g for g in map(_group, args) if g is not None]
            if groups and type(groups[0]).__module__.split(".")[0] != "torch":
                return  # a Python backend: its class wrapper records the call
            tensors = _tensors(args[0]) if args else []
            name = groups[0].group_name if groups else None
            self.record("launch", comm=name, group=name, op=op_name(func),
                        ops=_count(args[0]) if args else 0, stream=None,
                        device=tensors[0].device.type if tensors else None, backend=None,
                        coalesced="coalesced" in func, source="dispatcher")

    def world_created(self, world: dist.ProcessGroup) -> None:
        """Watch the world's class when it is a Python backend."""
        self.watch_class(type(world))

    def watch_class(self, cls: type) -> None:
        """Wrap the collective and P2P methods ``cls`` (a Python ProcessGroup subclass) defines in Python."""
        if cls.__module__.split(".")[0] == "torch" or any(c is cls for c, _, _ in self._wrapped):
            return
        for klass in cls.__mro__:
            if klass.__module__.split(".")[0] in ("torch", "builtins", "pybind11_builtins"):
                break
            for name in PY_METHODS:
                if name in vars(klass) and not any(c is cls and n == name for c, n, _ in self._wrapped):
                    self._wrapped.append((cls, name, cls.__dict__.get(name)))
                    setattr(cls, name, self._wrap(getattr(cls, name), name))

    def _wrap(self, method: Any, name: str) -> Any:
        probe = self

        @functools.wraps(method)
        def launch(pg: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(probe._depth, "n", 0)
            if depth == 0:
                with probe.boundary("launch"):  # a fault here is the suite's, never the backend's call's
                    tensors = _tensors(args[0]) if args else []
                    group = _python_group_name(pg)
                    probe.record("launch", comm=group, group=group, op=PY_METHODS[name],
                                 ops=_count(args[0]) if args else 0, stream=None,
                                 device=tensors[0].device.type if tensors else None, backend=pg.getBackendName(),
                                 coalesced="coalesc" in name, source="class")
            probe._depth.n = depth + 1
            try:
                return method(pg, *args, **kwargs)
            finally:
                probe._depth.n = depth

        return launch

    def close(self) -> None:
        """Pop the dispatch mode and restore every wrapped method."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for cls, name, original in reversed(self._wrapped):
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._wrapped.clear()
