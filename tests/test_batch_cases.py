"""The generated batch_isend_irecv lists (conformance/checks/batch_cases.py) are consistent: every receive a rank
lists has the send it expects on its peer's list, each order is what it says, and the plan's boundary cases hit
every pattern, order and repeat count."""

from collections import Counter

import pytest

from conformance.checks.batch_cases import ORDERS, PATTERNS, PLAN, ordered_ops
from conformance.checks.cases import Case, Generation


def _case(pattern: str, order: str, repeat: int) -> Case:
    return Case("batch", 0, (("pattern", pattern), ("order", order), ("repeat", repeat)))


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("order", ORDERS)
def test_every_receive_has_the_send_it_expects(n: int, pattern: str, order: str) -> None:
    lists = {r: ordered_ops(_case(pattern, order, 3), r, n, seed=7) for r in range(n)}
    sent = Counter((r, peer, k) for r, ops in lists.items() for kind, peer, k in ops if kind == "send")
    received = Counter((peer, r, k) for r, ops in lists.items() for kind, peer, k in ops if kind == "recv")
    assert sent == received and max(sent.values()) == 1
    assert all(peer != r for r, ops in lists.items() for _, peer, _ in ops)


@pytest.mark.parametrize("n", [2, 4])
def test_each_order_is_what_it_says(n: int) -> None:
    kinds = {order: [kind for kind, _, _ in ordered_ops(_case("every peer", order, 2), 1, n, seed=7)]
             for order in ORDERS}
    half = len(kinds["sends first"]) // 2
    assert kinds["sends first"] == ["send"] * half + ["recv"] * half
    assert kinds["receives first"] == ["recv"] * half + ["send"] * half
    assert kinds["alternating, receive first"] == ["recv", "send"] * half
    assert sorted(kinds["shuffled"]) == sorted(kinds["sends first"])
    assert ordered_ops(_case("ring", "shuffled", 3), 1, n, seed=7) == ordered_ops(_case("ring", "shuffled", 3), 1, n,
                                                                                 seed=7)


def test_the_boundary_cases_hit_every_pattern_order_and_repeat() -> None:
    hit = PLAN.coverage(PLAN.cases(Generation(), 4))
    for dim in ("pattern", "order", "repeat"):
        assert len(hit[dim]) == len(PLAN.dims[dim]), (dim, hit[dim])
