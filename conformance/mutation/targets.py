"""What each mutation target mutates, and the suite command that judges its mutants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MutationTarget:
    """A tree of modules to mutate and the suite target whose verdict judges a mutant of it."""

    name: str
    source: str  # the folder mutated, relative to the repository root
    suite_target: str  # the target `run` / `certify` judges it on
    options: dict[str, Any] = field(default_factory=dict)
    import_module: str = ""  # the vendor module certify imports first (a mutant that breaks it is killed)
    command: str = ""  # the user-facing command whose verdict the judge reproduces


TARGETS = {
    "simulator": MutationTarget("simulator", "simulator", "sim",
                                command="python -m conformance run --target sim --world-sizes 2,4"),
    # cli.cmd_certify's options for `certify --backend toyccl --device cpu --import toyccl` (no declared capabilities)
    "toyccl": MutationTarget("toyccl", "examples/toyccl/toyccl", "vendor",
                             options={"backend": "toyccl", "device": "cpu", "module": "toyccl", "package": None,
                                      "capabilities": []},
                             import_module="toyccl",
                             command="python -m conformance certify --backend toyccl --device cpu --import toyccl"),
}
