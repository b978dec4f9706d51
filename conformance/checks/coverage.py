"""Which boundary values of each generated dimension every data check hits, for a seed, budget and world size.

The plans here are the ones the checks run (each check notes, on rank 0, how many cases its plans ran and
how many boundary values of each dimension they hit; this module lists which).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

from conformance.checks import batch_cases, coalescing_cases, group_programs, option_trees, p2p_cases, split_trees
from conformance.checks import collective_cases as cc
from conformance.checks import collective_refusals as refusals
from conformance.checks.cases import Generation, Plan, show
from conformance.checks.programs import all_programs, coverage, dimensions, possible_kinds, program_groups


def plans(world_size: int, any_source: bool = True) -> dict[str, list[tuple[Plan, int]]]:
    """Requirement id -> the (plan, group size) pairs its check runs on the world (subgroups run the same
    plans at their own size). ``any_source``: whether the target has recv(src=None)."""
    caps = {"p2p_any_source"} if any_source else set()
    fake = SimpleNamespace(target=SimpleNamespace(capabilities=caps))
    n = world_size
    return {
        "COLL-ALLREDUCE-OPS": [(cc.ALL_REDUCE, n)],
        "COLL-GATHER-SCATTER-ORDER": [(cc.GATHER, n), (cc.IN_PLACE, n), (cc.ARRIVAL_GATHER, n)],
        "COLL-ROOTED": [(cc.rooted_plan(n, big=True), n)],
        "COLL-NONCONTIGUOUS": [(cc.NONCONTIGUOUS, n)],
        "COLL-ALLTOALL-UNEVEN": [(cc.ALLTOALL, n), (cc.ALLTOALL_OMITTED, n), (cc.ALLTOALL_IDLE, n),
                                 (cc.ARRIVAL_ALLTOALL, n)],
        "P2P-DATA": [(p2p_cases.plan(fake), n)],  # type: ignore[arg-type]
        "COAL-SYNC-RESULTS": [(coalescing_cases.PLAN, n)],
        "COAL-BATCH-WAIT": [(batch_cases.PLAN, n)],
        "COLL-BAD-ARGS-REFUSED": [(refusals.bad_args_plan(n), n)],
        "COLL-MISMATCH-REFUSED": [(refusals.mismatch_plan(n), n)],
        "COLL-ABSENT-PEER": [(refusals.absent_plan(n), n)],
    }


def rows(generation: Generation, world_size: int) -> Iterator[tuple[str, str, int, str, list[str], list[str]]]:
    """(requirement, plan, cases, dimension, boundary values hit, boundary values missed) for every dimension;
    API-OP-PROGRAMS' rows count the steps of its programs (every kind offered, tags declared), SPLIT-TREES' and
    HINT-SPLIT-TREES' their trees, API-GROUP-PROGRAMS' its programs (a target that binds, splits and receives from
    any source)."""
    drawn = [s for steps in all_programs(generation.seed, generation.budget, program_groups(world_size), True,
                                         possible_kinds(world_size)) for s in steps]
    yield from _named_rows("API-OP-PROGRAMS", "programs", len(drawn), dimensions(), coverage(drawn))
    made = split_trees.trees(world_size, generation.seed, generation.budget)
    yield from _named_rows("SPLIT-TREES", "split trees", len(made), split_trees.dimensions(world_size),
                           split_trees.coverage(made))
    yield from _named_rows("HINT-SPLIT-TREES", "split trees", len(made), option_trees.dimensions(),
                           option_trees.coverage(len(made), generation.seed))
    lifecycles = group_programs.programs(generation.seed, generation.budget, world_size, True, True, True)
    yield from _named_rows("API-GROUP-PROGRAMS", "group programs", len(lifecycles), group_programs.dimensions(),
                           group_programs.coverage(lifecycles))
    for requirement, pairs in plans(world_size).items():
        for plan, n in pairs:
            cases = plan.cases(generation, n)
            hit = plan.coverage(cases)
            for dim, values in plan.dims.items():
                missed = [show(v) for v in values if show(v) not in hit[dim]]
                yield requirement, plan.name, len(cases), dim, hit[dim], missed


def _named_rows(requirement: str, plan: str, cases: int, dims: dict[str, tuple[str, ...]],
                hit: dict[str, set[str]]) -> Iterator[tuple[str, str, int, str, list[str], list[str]]]:
    """Rows of a generator whose dimension values are names: each dimension's values hit and missed, in order."""
    for dim, values in dims.items():
        yield (requirement, plan, cases, dim, [v for v in values if v in hit[dim]],
               [v for v in values if v not in hit[dim]])
