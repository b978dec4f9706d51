"""Options along split trees (HINT-SPLIT-TREES): the sets, the levels' choices and what each child must hold."""

from __future__ import annotations

import pytest

from conformance.checks import option_trees as ot
from conformance.checks.split_trees import LEVELS


def test_sets_differ_in_every_field_but_net_name_and_stay_valid() -> None:
    for i, a in enumerate(ot.OPTION_SETS):
        assert 1 <= a["min_ctas"] <= a["max_ctas"] <= 32 and a["cga_cluster_size"] in (1, 2, 4, 8)
        assert a["net_name"] == "Socket"
        for b in ot.OPTION_SETS[i + 1:]:
            assert all(a[k] != b[k] for k in a if k not in ("net_name", "is_high_priority_stream")), (a, b)


def test_levels_never_give_the_worlds_set_and_are_seeded() -> None:
    for tree in range(12):
        chosen = ot.level_options(tree, 23, LEVELS)
        assert len(chosen) == LEVELS and 0 not in chosen
        assert chosen == ot.level_options(tree, 23, LEVELS)
    assert ot.level_options(1, 23, LEVELS) == [ot.INHERIT] * LEVELS  # the world's all the way down


@pytest.mark.parametrize("count", [3, 5])
def test_the_first_trees_hit_every_value(count: int) -> None:
    assert ot.coverage(count, 23) == {dim: set(values) for dim, values in ot.dimensions().items()}
