"""A defective group builder, for the derived-groups check (conformance/checks/derived_groups.py)."""

from __future__ import annotations

from conformance.checks.derived_groups import rank_groups


def hardcoded_order_builder(source: list[list[int]], order: str, sizes: dict[str, int],
                            offset: int) -> list[list[int]]:
    """Megatron PR 3249's defect: recompute data-parallel groups with a fixed order and no offset."""
    return rank_groups("tp-cp-ep-dp-pp", sizes, "dp", 0)
