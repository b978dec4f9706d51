"""Probes that need no cooperation from the backend under test (``PROBES`` names them) and ``combine``, which
joins them with a backend's own probe (for each event kind the first part that observes it answers).

What each was measured to see, and how to add one: conformance/probes/README.md. Warnings need no probe;
those raised on a backend's own threads reach only stderr and cannot be seen.
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
