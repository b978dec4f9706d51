"""Planted defects as parts: named in one table, resolved once per backend, recorded when consulted."""

import os

import pytest
import torch

import simulator
from simulator.defects import DEFECTS, ENV, planted, resolve
from simulator.reduction import Kernel


def test_defects_are_named_resolved_once_and_read_from_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown simulator defect"):
        resolve(names=["avg_as_summ"])  # a typo fails when the backend is resolved, not when a branch runs
    monkeypatch.setenv(ENV, "avg_as_sum")
    settings = resolve(names=["barrier_no_wait"])
    monkeypatch.setenv(ENV, "")
    assert settings.defects == {"avg_as_sum", "barrier_no_wait"} == planted(["barrier_no_wait", "avg_as_sum"])
    assert DEFECTS["barrier_no_wait"].overrides["group"] in settings.group_class.__mro__
    assert DEFECTS["avg_as_sum"].overrides["kernel"] in type(settings.parts.kernel).__mro__
    assert DEFECTS["minmax_swapped"].overrides["kernel"] not in type(settings.parts.kernel).__mro__
    clean = resolve()
    assert clean.group_class is simulator.SimProcessGroup and type(clean.parts.kernel) is Kernel
    assert os.environ.get(ENV) == ""


def test_every_defect_names_a_description_and_overrides_methods_its_part_has() -> None:
    """A flaw overriding a method its part lacks would never run: the defect could not be planted."""
    settings = resolve()
    bases = {"group": settings.group_class, "kernel": Kernel}
    for name, defect in DEFECTS.items():
        assert defect.description, name
        for part, cls in defect.overrides.items():
            base = bases.get(part) or getattr(settings.parts, part)
            base = base if isinstance(base, type) else type(base)
            own = [m for m, v in vars(cls).items() if callable(v) and not m.startswith("__")]
            missing = [m for m in own if not hasattr(base, m) and not hasattr(simulator.stacks.TorchcommsPath, m)]
            assert own and not missing, f"{name}: {cls.__name__} overrides {missing} that {base.__name__} lacks"


def test_a_consulting_backend_records_the_defects_whose_methods_ran() -> None:
    seen: set[str] = set()
    settings = resolve(consulted=seen)
    out = torch.zeros(2)
    settings.parts.kernel.reduce_into(out, [torch.ones(2), torch.ones(2)], "sum")
    assert out.tolist() == [2.0, 2.0]  # the recording kernel still reduces as the reference does
    assert {"minmax_swapped", "int_sum_via_float32"} <= seen and "avg_as_sum" not in seen  # no avg ran
