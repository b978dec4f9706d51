"""toyccl's own options object: NCCL-style fields plus a hints map, validated on use."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

# Hint names toyccl reads, and how each value must parse.
KNOWN_HINTS: dict[str, type] = {
    "is_high_priority_stream": bool, "highPriority": bool, "cgaClusterSize": int, "maxCTAs": int,
    "minCTAs": int, "netName": str,
}
_BOOLS = frozenset({"true", "1", "false", "0"})  # the spellings a boolean hint may take


MAX_CGA_CLUSTER_SIZE = 8  # as NCCL's cgaClusterSize


@dataclass
class ToyOptions:
    """What a toyccl group is created with (``pg_options``); torch deep-copies it for split children."""

    is_high_priority_stream: bool = False
    cga_cluster_size: int | None = None
    max_ctas: int | None = None
    min_ctas: int | None = None
    net_name: str | None = None
    hints: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ValueError naming the field and value that cannot be used."""
        for key in ("cga_cluster_size", "max_ctas", "min_ctas"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"toyccl: option {key}={value!r} must be a non-negative integer")
        for key in ("min_ctas", "max_ctas"):  # NCCL refuses them <= 0
            if getattr(self, key) == 0:
                raise ValueError(f"toyccl: option {key}=0 must be a positive integer")
        if self.cga_cluster_size is not None and self.cga_cluster_size > MAX_CGA_CLUSTER_SIZE:
            raise ValueError(f"toyccl: option cga_cluster_size={self.cga_cluster_size} exceeds the maximum "
                             f"{MAX_CGA_CLUSTER_SIZE}")
        if self.min_ctas is not None and self.max_ctas is not None and self.min_ctas > self.max_ctas:
            raise ValueError(f"toyccl: option min_ctas={self.min_ctas} exceeds max_ctas={self.max_ctas}")
        for key, value in self.hints.items():
            kind = KNOWN_HINTS.get(key)
            text = str(value)
            if (kind is bool and text.lower() not in _BOOLS) or (kind is int and not text.isdigit()):
                raise ValueError(f"toyccl: hint {key}={text!r} is not a valid {kind.__name__}")

    def config(self) -> dict[str, Any]:
        """The communicator config these options give: fields, and the hints toyccl knows (others warn)."""
        self.validate()
        hints = {}
        for key, value in self.hints.items():
            if key in KNOWN_HINTS:
                hints[key] = str(value)
            else:
                warnings.warn(f"toyccl: unknown hint {key!r} ignored (known: {sorted(KNOWN_HINTS)})",
                              UserWarning, stacklevel=3)
        return {"is_high_priority_stream": self.is_high_priority_stream, "cga_cluster_size": self.cga_cluster_size,
                "max_ctas": self.max_ctas, "min_ctas": self.min_ctas, "net_name": self.net_name, "hints": hints}
