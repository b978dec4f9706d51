"""Communicator config: NCCL-style options, torchcomms hint names, validation."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

# Option field -> the hint key torchcomms reads for it (ncclx/nccl backend, torchcomms facts).
TORCHCOMMS_HINT_KEYS: dict[str, tuple[str, ...]] = {
    "is_high_priority_stream": ("is_high_priority_stream",),
    "cga_cluster_size": ("cgaClusterSize", "cga_cluster_size"),
    "max_ctas": ("maxCTAs", "max_ctas"),
    "min_ctas": ("minCTAs", "min_ctas"),
    "net_name": ("netName",),
}
KNOWN_HINTS: frozenset[str] = frozenset(
    k for keys in TORCHCOMMS_HINT_KEYS.values() for k in keys
) | {"blocking", "splitShare", "split_share", "max_event_pool_size", "commName"}
_BOOL_WORDS = {"1": True, "true": True, "yes": True, "y": True, "0": False, "false": False, "no": False, "n": False}


class ConfigError(ValueError):
    """An invalid option or hint value; names the key and the value."""


@dataclass
class SimOptions:
    """Process-group options for the simulator, shaped like ProcessGroupNCCL.Options.

    Pass as ``pg_options`` to init_process_group, new_group or split_group.
    """

    is_high_priority_stream: bool = False
    cga_cluster_size: int | None = None
    max_ctas: int | None = None
    min_ctas: int | None = None
    net_name: str | None = None
    hints: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Refuse invalid values, naming the key and the value."""
        if not isinstance(self.is_high_priority_stream, bool):
            raise ConfigError(f"invalid value for is_high_priority_stream: {self.is_high_priority_stream!r}")
        for key in ("cga_cluster_size", "max_ctas", "min_ctas"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ConfigError(f"invalid value for {key}: {value!r} (expected a non-negative int)")
        for key in ("min_ctas", "max_ctas"):  # NCCL: "Invalid config min/max channels" (init.cc v2.28.9:1866)
            if getattr(self, key) == 0:
                raise ConfigError(f"invalid value for {key}: 0 (expected a positive int)")
        if self.cga_cluster_size is not None and self.cga_cluster_size > 8:
            raise ConfigError(f"invalid value for cga_cluster_size: {self.cga_cluster_size!r} (at most 8)")
        if self.min_ctas is not None and self.max_ctas is not None and self.min_ctas > self.max_ctas:
            raise ConfigError(f"invalid value for min_ctas: {self.min_ctas!r} (greater than max_ctas {self.max_ctas})")
        if self.net_name is not None and (not isinstance(self.net_name, str) or not self.net_name):
            raise ConfigError(f"invalid value for net_name: {self.net_name!r}")
        for key, value in self.hints.items():
            if not isinstance(value, str):
                raise ConfigError(f"invalid hint value for key {key!r}: {value!r} (hints are strings)")

    def as_config(self) -> dict[str, Any]:
        """The effective config as a plain dict."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}


_CTAS_HINTS = ("minCTAs", "min_ctas", "maxCTAs", "max_ctas")  # NCCL refuses them <= 0 (init.cc v2.28.9:1866)


def parse_hints(hints: dict[str, str], comm_name: str,
                warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Apply torchcomms hint semantics: typed values checked, unknown keys dropped with a warning
    through ``warn`` (None drops them silently)."""
    applied: dict[str, Any] = {}
    for key, raw in hints.items():
        if key not in KNOWN_HINTS:
            if warn is not None:
                warn(f"hint {key!r} is not supported by the simulator, ignoring for comm {comm_name!r}")
            continue
        if key in ("is_high_priority_stream", "blocking", "splitShare", "split_share"):
            if raw.lower() not in _BOOL_WORDS:
                raise ConfigError(f"invalid hint value for key {key!r}: {raw!r}")
            applied[key] = _BOOL_WORDS[raw.lower()]
        elif key in ("netName", "commName"):
            applied[key] = raw
        else:
            try:
                applied[key] = int(raw)
            except ValueError:
                raise ConfigError(f"invalid hint value for key {key!r}: {raw!r}") from None
            if applied[key] < 0:
                raise ConfigError(f"invalid hint value for key {key!r}: {raw!r} (expected a non-negative int)")
            if applied[key] == 0 and key in _CTAS_HINTS:
                raise ConfigError(f"invalid hint value for key {key!r}: {raw!r} (expected a positive int)")
    low = next((applied[k] for k in ("minCTAs", "min_ctas") if k in applied), None)
    high = next((applied[k] for k in ("maxCTAs", "max_ctas") if k in applied), None)
    if low is not None and high is not None and low > high:
        raise ConfigError(f"invalid hint value for key 'minCTAs': {low} (greater than maxCTAs {high})")
    return applied


def options_to_hints(options: SimOptions, net_name_key: str = "netName") -> dict[str, str]:
    """Translate NCCL-style option fields into torchcomms CommOptions.hints (first key name)."""
    hints = dict(options.hints)
    for name, keys in TORCHCOMMS_HINT_KEYS.items():
        value = getattr(options, name)
        if value is None or (name == "is_high_priority_stream" and value is False):
            continue
        key = net_name_key if name == "net_name" else keys[0]
        hints[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return hints
