"""The boundary cases of the NCCL-style option fields, from NCCL's own validation.

NCCL refuses a config whose minCTAs or maxCTAs is set and <= 0, or whose minCTAs exceeds maxCTAs ("Invalid config
min/max channels attribute value %d/%d": src/init.cc v2.18.3:1520-1523, v2.28.9:1866-1869, v2.30.7:2325-2328), and
a cgaClusterSize below 0 (v2.28.9:1860); torch passes the fields through unchecked. Every (min_ctas, max_ctas)
pair over CTAS is a case: valid ones must be accepted and reach the communicator, the others refused naming
the field and its value.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# net_name "Socket": NCCL then considers only the net plugin of that name and fails init when it cannot
# start it ("Failed to initialize any NET plugin", NCCL 2.30.7 src/plugin/net.cc:330-349); the Socket
# plugin is built in (net.cc:303, src/transport/net_socket.cc:804) and works on every host, IB does not.
OPTIONS: dict[str, Any] = {
    "is_high_priority_stream": True, "cga_cluster_size": 4, "max_ctas": 16, "min_ctas": 2, "net_name": "Socket",
}

CTAS = (0, 1, 2)  # below, at and above the smallest valid value


@dataclass(frozen=True)
class OptionCase:
    """Option fields, and for an invalid set the fields a refusal may name (any one) with the value it must."""

    fields: dict[str, int]
    refused_keys: tuple[str, ...] = ()
    refused_value: str = ""

    @property
    def valid(self) -> bool:
        """Whether NCCL accepts these fields."""
        return not self.refused_keys


def ctas_cases() -> Iterator[OptionCase]:
    """Every (min_ctas, max_ctas) pair over CTAS, and each field alone at 0."""
    for low in CTAS:
        for high in CTAS:
            fields = {"min_ctas": low, "max_ctas": high}
            if low < 1 or high < 1:
                keys = tuple(k for k, v in fields.items() if v < 1)
                yield OptionCase(fields, keys, "0")
            elif low > high:
                yield OptionCase(fields, ("min_ctas", "max_ctas"), str(low))
            else:
                yield OptionCase(fields)
    for key in ("min_ctas", "max_ctas"):
        yield OptionCase({key: 0}, (key,), "0")
