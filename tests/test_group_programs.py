"""Generated group programs (API-GROUP-PROGRAMS): what they draw and the options each group must hold."""

from __future__ import annotations

import pytest

from conformance.checks import group_programs as gp
from conformance.checks.group_programs import DEFAULTS, UNJUDGED, GroupProgram, GroupStep


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("bound", [True, False])
def test_programs_are_seeded_and_keep_to_their_rules(world_size: int, bound: bool) -> None:
    drawn = gp.programs(23, 4, world_size, bound, True, True)
    assert drawn == gp.programs(23, 4, world_size, bound, True, True)
    assert drawn != gp.programs(24, 4, world_size, bound, True, True)
    for program in drawn:
        assert program.steps[0].kind == "new"
        destroyed = False
        for step in program.steps:
            layers = gp.layers_after(world_size, program.steps[:step.index])
            if step.kind in ("split", "use", "destroy"):
                assert layers[step.layer], f"{step.describe()} acts on a destroyed layer"
            assert not (destroyed and step.kind in ("new", "split")), "a group made after a destroy"
            assert step.kind != "destroy" or (step.layer != gp.WORLD_LAYER and step.index >= gp.FIRST_DESTROY)
            assert step.kind != "split" or program.bound, "a split of an unbound world (lazy_splits not given)"
            destroyed |= step.kind == "destroy"
        for groups in gp.layers_after(world_size, program.steps):
            assert not groups or sorted(r for g in groups for r in g) == list(range(world_size))


def test_the_default_run_hits_every_value_of_every_dimension() -> None:
    drawn = gp.programs(23, 2, 4, True, True, True)
    hit = gp.coverage(drawn)
    for dim, values in gp.dimensions().items():
        assert set(values) <= hit[dim], (dim, set(values) - hit[dim])


def test_splits_inherit_their_parents_set_and_new_groups_the_defaults_or_the_worlds() -> None:
    steps = (GroupStep(0, "new", parts=(((1, 0), (2, 3)),), options=None),
             GroupStep(1, "split", layer=1, parts=(((0,), (1,)), ((1, 0),)), options=None),
             GroupStep(2, "new", parts=(((0, 1, 2, 3),),), options=2),
             GroupStep(3, "split", layer=3, parts=(((3, 2), (0, 1)),), options=None),
             GroupStep(4, "split", layer=0, parts=(((0, 1, 2, 3),),), options=3))
    program = GroupProgram(bound=True, world_options=0, steps=steps)
    assert gp.expected_sets(program, lambda step: False) == [[0], [DEFAULTS, DEFAULTS],
                                                               [DEFAULTS, DEFAULTS, DEFAULTS], [2], [2, 2], [3]]
    assert gp.expected_sets(program, lambda step: True)[1:3] == [[0, 0], [0, 0, 0]]
    assert gp.expected_sets(program, lambda step: None)[2] == [UNJUDGED] * 3
    # a split's children follow their parent groups' order, then the order of its parts
    assert gp.layers_after(4, steps)[2] == [(0,), (1,), (2, 3)]


def test_a_split_maps_its_parts_through_the_parents_group_ranks() -> None:
    steps = (GroupStep(0, "new", parts=(((3, 1), (0, 2)),)),
             GroupStep(1, "split", layer=1, parts=(((1,), (0,)), ((0, 1),))))
    assert gp.layers_after(4, steps) == [[(0, 1, 2, 3)], [(1, 3), (0, 2)], [(3,), (1,), (0, 2)]]
