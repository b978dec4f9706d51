"""The conformance suite's target for toyccl, declared through the `conformance.targets` entry point."""

from __future__ import annotations

from collections.abc import Iterable

from conformance.targets.vendor import VendorTarget

# What toyccl declares it supports; the suite verifies each (a skip among them is a failure).
CAPABILITIES = ("device_binding", "split", "options", "hints", "p2p_tags", "p2p_any_source", "lazy_pair_comms")


class ToycclTarget(VendorTarget):
    """VendorTarget preset for toyccl: `conformance run --target toyccl` needs no options."""

    name = "toyccl"

    def __init__(self, backend: str = "toyccl", device: str = "cpu", module: str = "toyccl",
                 package: str | None = "toyccl", options: bool = False,
                 capabilities: str | Iterable[str] | None = CAPABILITIES, options_factory: str | None = None) -> None:
        super().__init__(backend=backend, device=device, module=module, package=package, options=options,
                         capabilities=capabilities, options_factory=options_factory)
