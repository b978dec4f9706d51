"""The conformance suite's target for toyccl, declared through the `conformance.targets` entry point."""

from __future__ import annotations

from conformance.targets.vendor import VendorTarget


class ToycclTarget(VendorTarget):
    """VendorTarget preset for toyccl: `conformance certify --target toyccl` needs no options."""

    name = "toyccl"

    def __init__(self, backend: str = "toyccl", device: str = "cpu", module: str = "toyccl",
                 package: str | None = "toyccl", options: bool = False) -> None:
        super().__init__(backend=backend, device=device, module=module, package=package, options=options)
