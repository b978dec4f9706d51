"""COLL-ALLREDUCE-AGREE's inputs: reproducible, and able to show a backend whose summation order differs by rank."""

from __future__ import annotations

import torch

from conformance.checks import agreement


def test_inputs_are_the_same_on_every_rank_that_draws_them() -> None:
    a = agreement.inputs(23, 2, "SUM", torch.float32, 1000)
    b = agreement.inputs(23, 2, "SUM", torch.float32, 1000)
    assert torch.equal(a, b)
    assert not torch.equal(a, agreement.inputs(23, 3, "SUM", torch.float32, 1000))


def test_sum_order_shows_from_three_members_and_cannot_at_two() -> None:
    for members in ([0, 1, 2], [0, 1, 2, 3], [1, 2, 3]):
        assert agreement.order_matters(23, members), members
    assert not agreement.order_matters(23, [0, 1])  # a + b == b + a: two members cannot disagree by order


def test_product_inputs_stay_near_one_and_sum_inputs_fit_float16() -> None:
    factors = agreement.inputs(5, 0, "PRODUCT", torch.float32, 5000)
    assert bool(((factors > 0.93) & (factors < 1.07)).all())
    values = agreement.inputs(5, 0, "SUM", torch.float16, 5000)
    assert bool(torch.isfinite(values.float() * 8).all())


def test_digest_tells_results_a_rounding_apart() -> None:
    t = torch.tensor([1.0, 2.0, 3.0])
    nudged = t.clone()
    nudged[1] = torch.nextafter(nudged[1], torch.tensor(3.0))
    assert agreement.digest(t) == agreement.digest(t.clone())
    assert agreement.digest(t) != agreement.digest(nudged)
