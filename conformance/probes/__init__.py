"""Probes that need no cooperation from the backend under test.

Each module watches one thing from the outside and documents, in its docstring, what it was
measured to see and not see on gloo, on the simulator and on a pure-Python backend (toyccl):

- ``launches``: one ``launch`` event per front-end call into the backend, from torch's
  dispatcher (C++ backends) or from the Python backend class's own methods.
- ``store``: ``comm_created`` events read off the bootstrap keys a backend writes to the
  store torch hands it (gloo and other store-bootstrapping backends).

Warnings need no probe: torch turns a C++ ``TORCH_WARN`` raised on the calling thread into a
Python warning, which a check records itself with ``warnings.catch_warnings`` (the runner
silences warnings a check does not catch, so a recording hook would see nothing). Warnings
raised on a backend's own threads only reach stderr and are not observable.

To add a probe: write its module here (a ``RecordingProbe`` subclass with ``observes`` and, where
it needs them, ``start``, ``attach_store``, ``world_created`` and ``close``) and add one line to
``PROBES``; a target starts it by listing the name in ``Target.probes``.

``combine`` joins them with a backend's own probe: for each event kind the first part that
observes it answers. Every part exposes ``control_missing(kind)``: None when the probe has
seen, in this run, the positive control for that kind (e.g. the world communicator being
made), else a sentence saying what it did not see; a check that asserts absence must turn a
missing control into not-observable.
"""

from __future__ import annotations

import importlib

from conformance.probes.base import CombinedProbe, RecordingProbe, combine

# The outside probes a target can name in ``Target.probes``: name -> "module:class".
PROBES: dict[str, str] = {
    "launches": "conformance.probes.launches:LaunchProbe",
    "store": "conformance.probes.store:StoreProbe",
}


def probe_class(name: str) -> type[RecordingProbe]:
    """The probe class registered as ``name``."""
    path = PROBES.get(name)
    if path is None:
        raise ValueError(f"unknown probe {name!r}; known probes: {', '.join(PROBES)}")
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


__all__ = ["PROBES", "CombinedProbe", "RecordingProbe", "combine", "probe_class"]
