"""The integration paths the simulator models, each a process group class over the reference one.

``nccl`` is the reference itself (``SimProcessGroup``): options become an NCCL config. ``torchcomms``
turns the process-group options into ``CommOptions.hints`` under the names torchcomms reads.
"""

from __future__ import annotations

from typing import Any

from simulator.backend import SimProcessGroup
from simulator.config import SimOptions, options_to_hints, parse_hints


class TorchcommsPath(SimProcessGroup):
    """The torchcomms path: a communicator's config is the hints its options translate to."""

    def _effective_config(self, options: SimOptions, comm_name: str, warn: bool = True) -> dict[str, Any]:
        return {"hints": parse_hints(self._torchcomms_hints(options), comm_name, self._warn_hint if warn else None)}

    def _torchcomms_hints(self, options: SimOptions) -> dict[str, str]:
        """The hints torchcomms gets for ``options`` (``netName``, ``cgaClusterSize``, ...)."""
        return options_to_hints(options)


PATHS: dict[str, type[SimProcessGroup]] = {"nccl": SimProcessGroup, "torchcomms": TorchcommsPath}
