"""optional_case's consistency rule (conformance/checks/README.md, rule 5) and the option boundary grid."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist

from conformance.checks.common import optional_case
from conformance.checks.option_bounds import ctas_cases
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed


def _ctx() -> CheckContext:
    return CheckContext(0, 2, SimpleNamespace(), dist.HashStore(), SimpleNamespace(id="TEST-OPTIONAL"),  # type: ignore[arg-type]
                        5.0)


def _refuse() -> None:
    raise RuntimeError("gather rejected: root needs 2 output tensors, got 0")


def test_an_op_refused_for_one_root_after_it_ran_for_another_fails_naming_both() -> None:
    ctx = _ctx()
    assert optional_case(ctx, "gather to root 1", lambda: None, ("gather",), kind="gather (lists)")
    with pytest.raises(CheckFailed, match=r"gather to root 0 was refused .*gather to root 1 ran"):
        optional_case(ctx, "gather to root 0", _refuse, ("gather",), kind="gather (lists)")


def test_an_op_that_runs_after_it_was_refused_fails_too() -> None:
    ctx = _ctx()
    assert not optional_case(ctx, "gather to root 0", _refuse, ("gather",), kind="gather (lists)")
    with pytest.raises(CheckFailed, match=r"gather to root 1 ran.*gather to root 0 was refused"):
        optional_case(ctx, "gather to root 1", lambda: None, ("gather",), kind="gather (lists)")


def test_refused_everywhere_or_of_different_kinds_passes() -> None:
    ctx = _ctx()
    assert not optional_case(ctx, "gather to root 0", _refuse, ("gather",), kind="gather (lists)")
    assert not optional_case(ctx, "gather to root 1", _refuse, ("gather",), kind="gather (lists)")
    assert optional_case(ctx, "scatter from root 0", lambda: None, ("scatter",), kind="scatter (lists)")
    assert optional_case(ctx, "no kind given", lambda: None, ("x",)) and len(ctx.notes) == 2


def test_the_ctas_grid_follows_nccls_rule() -> None:
    """NCCL refuses minCTAs or maxCTAs <= 0 and minCTAs > maxCTAs (src/init.cc v2.28.9:1866-1869)."""
    cases = list(ctas_cases())
    pairs = {(c.fields["min_ctas"], c.fields["max_ctas"]): c.valid for c in cases if len(c.fields) == 2}
    assert pairs == {(lo, hi): lo >= 1 and hi >= 1 and lo <= hi for lo in (0, 1, 2) for hi in (0, 1, 2)}
    assert [c.fields for c in cases if len(c.fields) == 1] == [{"min_ctas": 0}, {"max_ctas": 0}]
    assert all(c.refused_value == "0" for c in cases if not c.valid and 0 in c.fields.values())
