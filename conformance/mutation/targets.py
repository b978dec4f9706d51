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
    capabilities_file: str = ""  # what the backend declares (certify --capabilities-file), relative to the root
    planted: tuple[str, ...] = ()  # modules of the folder that hold planted defects, not the behaviour judged
    stacks: tuple[str, ...] = ()  # the simulator stacks (``run --stack``) a survivor of the default one is judged on


TARGETS = {
    # flaws.py and defects.py are the planted defects and their table (simulator/parts.py), faults.py the planted
    # crashes and hangs of the suite's own fault tests (armed by SIM_FAULT only): no clean run executes a flaw or
    # a fault, so a mutant there survives by construction, as the defect-switch branches did before them
    # stacks: simulator.stacks.STACKS (not imported here: listing targets must not load torch); a mutant of one
    # stack's code survives the default stack's judgement by construction, so survivors are judged on each
    "simulator": MutationTarget("simulator", "simulator", "sim",
                                command="python -m conformance run --target sim --world-sizes 2,4",
                                planted=("flaws.py", "defects.py", "faults.py"),
                                stacks=("nccl-legacy", "nccl2", "nccl-lazy", "torchcomms")),
    # cli.cmd_certify's options for toyccl's documented certification (examples/toyccl/README.md): what it
    # declares is verified, so the checks needing options, hints, split, tags and any-source run
    "toyccl": MutationTarget("toyccl", "examples/toyccl/toyccl", "vendor",
                             options={"backend": "toyccl", "device": "cpu", "module": "toyccl", "package": None},
                             import_module="toyccl", capabilities_file="examples/toyccl/capabilities.toml",
                             command="python -m conformance certify --backend toyccl --device cpu --import toyccl "
                                     "--capabilities-file examples/toyccl/capabilities.toml"),
}
