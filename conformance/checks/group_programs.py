"""Generated group programs: seeded sequences of group creation, use and destruction (the generator).

The data checks judge ops on groups made one way at a time. A backend's control path keeps state across groups:
communicator caches, options copied (or not) from a parent, the world or the defaults, pair communicators per
group, eager or lazy creation, what destroy tears down. A bug there shows only after a particular sequence. A
program is such a sequence, the same on every rank: a world, bound or lazy, given options set 0 or none, then
STEPS steps drawn from

- ``new``: a drawn partition of the world made with new_group, its parts given one options set or none;
- ``split``: every group of a live layer (a partition, or the world) split into drawn parts of its group ranks,
  given one set or none (bound worlds only: split_group needs a bound parent);
- ``use``: on a live layer, an all_reduce in every part, or one message from a member to another through one of
  torch's P2P entry points;
- ``destroy``: every rank destroys its group of a live layer (never the world);

and at the end an all_reduce on every live layer. ``group_program_runs`` runs a program and judges every step
against the model this module keeps (which options each group must hold).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from conformance.checks.cases import stable_seed

STEPS = 10
PROGRAMS = 8  # at the default budget; one more per unit of budget above it
KINDS = ("new", "split", "use", "destroy")
WEIGHTS = {"new": 3, "split": 3, "use": 4, "destroy": 1}
# how a use step talks: a collective, or a message by each way torch hands P2P to a backend
ENTRIES = ("all_reduce", "send/recv", "isend/irecv", "batch_isend_irecv", "recv(src=None)")
WORLD_LAYER = 0
DEFAULTS = -1  # the options a group given none gets where that is the backend's defaults
UNJUDGED = -2  # a new_group given none where torch decides what it gets (and what splits of it inherit)
IDLE_LAYER = 2  # the second program's layer made at step 1 and destroyed at step 5 without an op
FIRST_DESTROY = 5  # destroy steps come from this index on, and no group is made after one


@dataclass(frozen=True)
class GroupStep:
    """One step: its kind, the layer it acts on (split: the parent layer; use, destroy: the layer used), the
    parts (new: global ranks of each part; split: per parent group, the parts as that group's ranks), the
    options set given (an index into OPTION_SETS, or None), and for a use step the entry point and which
    members talk (positions in a part: the sender's, then how far on the receiver is)."""

    index: int
    kind: str
    layer: int = WORLD_LAYER
    parts: tuple[tuple[tuple[int, ...], ...], ...] = ()
    options: int | None = None
    entry: str = "all_reduce"
    talk: tuple[int, int] = (0, 1)

    def describe(self) -> str:
        """'#2 split of layer 1 into [[1, 0]] per group, given set 2'."""
        given = "no options" if self.options is None else f"options set {self.options}"
        if self.kind == "new":
            return f"#{self.index} new_group partition {[list(p) for p in self.parts[0]]} given {given}"
        if self.kind == "split":
            cuts = "; ".join(str([list(p) for p in parts]) for parts in self.parts)
            return f"#{self.index} split of each group of layer {self.layer} into {cuts} (group ranks) given {given}"
        if self.kind == "use":
            return f"#{self.index} {self.entry} on layer {self.layer}" + (
                "" if self.entry == "all_reduce" else f" (member at {self.talk[0]} to the one {self.talk[1]} on)")
        return f"#{self.index} destroy layer {self.layer}"


@dataclass(frozen=True)
class GroupProgram:
    """A world (bound or lazy, given options set 0 or none) and its steps."""

    bound: bool
    world_options: int | None
    steps: tuple[GroupStep, ...]

    def describe(self, upto: int | None = None) -> str:
        """The world and the steps (up to and including step index ``upto``)."""
        world = f"{'bound' if self.bound else 'lazy'} world given " + (
            "no options" if self.world_options is None else f"options set {self.world_options}")
        shown = [s for s in self.steps if upto is None or s.index <= upto]
        return "; ".join([world, *(s.describe() for s in shown)])


def layers_after(world_size: int, steps: tuple[GroupStep, ...] | list[GroupStep]) -> list[list[tuple[int, ...]]]:
    """Each layer's groups as global ranks in group-rank order (torch sorts them), layer 0 the world; a destroyed
    layer is an empty list. Layer k + 1 is made by the k-th new or split step."""
    layers: list[list[tuple[int, ...]]] = [[tuple(range(world_size))]]
    for step in steps:
        if step.kind == "new":
            layers.append([tuple(sorted(p)) for p in step.parts[0]])
        elif step.kind == "split":
            layers.append([tuple(sorted(group[r] for r in part))
                           for group, parts in zip(layers[step.layer], step.parts, strict=True) for part in parts])
        elif step.kind == "destroy":
            layers[step.layer] = []
    return layers


def _has_live_splits(steps: list[GroupStep], layer: int) -> bool:
    """Whether a layer split from ``layer`` by one of ``steps`` is still live after them."""
    made = [s for s in steps if s.kind in ("new", "split")]
    destroyed = {s.layer for s in steps if s.kind == "destroy"}
    return any(s.kind == "split" and s.layer == layer and 1 + made.index(s) not in destroyed for s in made)


def _partition(rng: random.Random, items: list[int]) -> tuple[tuple[int, ...], ...]:
    """``items`` in a drawn order cut into 1 to len(items) parts."""
    order = list(items)
    rng.shuffle(order)
    ends = sorted(rng.sample(range(1, len(order)), rng.randint(0, len(order) - 1))) if len(order) > 1 else []
    return tuple(tuple(order[a:b]) for a, b in zip([0, *ends], [*ends, len(order)]))


def draw(seed: int, number: int, world_size: int, bound: bool, splits: bool, any_source: bool,
         lazy_splits: bool = False) -> GroupProgram:
    """Program ``number`` of the run with ``seed``: the same on every rank. ``bound``: the world is bound (split
    steps need ``splits`` and a bound world, or ``lazy_splits``: torch splits unbound groups, 2.15 on);
    ``any_source``: the target receives from any source."""
    rng = random.Random(stable_seed(seed, "group program", number, world_size, bound, splits, any_source,
                                    lazy_splits))
    steps: list[GroupStep] = []
    entries = [e for e in ENTRIES if any_source or e != "recv(src=None)"]
    for index in range(STEPS):
        layers = layers_after(world_size, steps)
        live = [k for k, groups in enumerate(layers) if groups]
        # torch 2.13 salts a split's hashed group name with the count of live groups, which a destroy lowers: a
        # group made after one could take a live group's name ('already registered', v2.13.0
        # distributed_c10d.py:5464-5468), so no group is made after a destroy
        destroyed = any(s.kind == "destroy" for s in steps)
        kinds = [k for k in KINDS if (k != "split" or (splits and (bound or lazy_splits)))
                 and (k not in ("new", "split") or not destroyed)
                 and (k != "destroy" or (len(live) > 1 and index >= FIRST_DESTROY))]
        kind = "new" if index == 0 else rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
        # the first program of a bound world splits the first partition at once and destroys it while the split
        # lives: the boundary of the 'destroyed' dimension, which drawn programs hit only sometimes
        boundary = number == 0 and "split" in kinds and index in (1, FIRST_DESTROY)
        kind = ("split" if index == 1 else "destroy") if boundary else kind
        # the second program (the first lazy one where worlds alternate) makes a layer at step 1 that runs no op, nor
        # is split, and destroys it at step 5: a destroy that must make no communicator (a teardown that reaches a
        # lazy group's communicator through its getter makes it in order to release it)
        idle = number == 1 and index in (1, FIRST_DESTROY)
        kind = ("new" if index == 1 else "destroy") if idle else kind
        spare = [k for k in live if number != 1 or index > FIRST_DESTROY or k != IDLE_LAYER]
        options = rng.choice((None, 1, 2, 3))
        if kind == "new":
            steps.append(GroupStep(index, kind, parts=(_partition(rng, list(range(world_size))),), options=options))
        elif kind == "split":
            layer = 1 if boundary else rng.choice(spare)
            cuts = tuple(_partition(rng, list(range(len(g)))) for g in layers[layer])
            steps.append(GroupStep(index, kind, layer=layer, parts=cuts, options=options))
        elif kind == "use":
            steps.append(GroupStep(index, kind, layer=rng.choice(spare), entry=rng.choice(entries),
                                   talk=(rng.randrange(8), 1 + rng.randrange(7))))
        else:  # a layer that live splits were made from, where there is one
            doomed = [k for k in live if k != WORLD_LAYER]
            parents = [k for k in doomed if _has_live_splits(steps, k)]
            steps.append(GroupStep(index, kind, layer=IDLE_LAYER if idle else rng.choice(parents if parents
                                                                                    else doomed)))
    return GroupProgram(bound=bound, world_options=rng.choice((0, None)), steps=tuple(steps))


def programs(seed: int, budget: int, world_size: int, bound: bool, splits: bool, any_source: bool,
             lazy_splits: bool = False) -> list[GroupProgram]:
    """The run's programs: PROGRAMS, one more per unit of budget above 2; the worlds alternate bound (where
    ``bound``) and lazy, starting bound."""
    count = PROGRAMS + max(0, budget - 2)
    return [draw(seed, number, world_size, bound and number % 2 == 0, splits, any_source, lazy_splits)
            for number in range(count)]


def expected_sets(program: GroupProgram, inherits: Callable[[GroupStep], bool | None]) -> list[list[int]]:
    """Per layer and group, the options set the group must hold: an index into OPTION_SETS, or DEFAULTS (a world
    given none holds the backend's defaults, and so does what inherits from it). A new_group given
    none holds the backend's defaults, or the world's where torch makes new_group through split_group
    (``new_inherits``); a split given none, its parent's."""
    world = DEFAULTS if program.world_options is None else program.world_options
    sets: list[list[int]] = [[world]]
    for step in program.steps:
        if step.kind == "new":
            taken = inherits(step)
            given = step.options if step.options is not None else UNJUDGED if taken is None else \
                world if taken else DEFAULTS
            sets.append([given] * len(step.parts[0]))
        elif step.kind == "split":
            parents = sets[step.layer]
            sets.append([parents[g] if step.options is None else step.options
                         for g, parts in enumerate(step.parts) for _ in parts])
    return sets


def dimensions(world_size: int = 3) -> dict[str, tuple[str, ...]]:
    """The programs' dimensions and their values (``conformance coverage``)."""
    return {"world": ("bound", "lazy"), "step": KINDS, "options": ("a set given", "none given"),
            "use": ENTRIES, "layer used": ("the world", "a new_group partition", "a split"),
            "destroyed": ("a layer with live splits of it", "a layer without", "a layer that ran no op")}


def coverage(drawn: list[GroupProgram]) -> dict[str, set[str]]:
    """Which values of each dimension ``drawn`` hits."""
    hit: dict[str, set[str]] = {dim: set() for dim in dimensions()}
    for program in drawn:
        hit["world"].add("bound" if program.bound else "lazy")
        made = ["the world"]
        for step in program.steps:
            hit["step"].add(step.kind)
            if step.kind in ("new", "split"):
                hit["options"].add("none given" if step.options is None else "a set given")
                made.append("a new_group partition" if step.kind == "new" else "a split")
            elif step.kind == "use":
                hit["use"].add(step.entry)
                hit["layer used"].add(made[step.layer])
            elif step.kind == "destroy":
                before = list(program.steps[:step.index])
                hit["destroyed"].add("a layer with live splits of it" if _has_live_splits(before, step.layer)
                                     else "a layer without")
                if not any(s.kind in ("use", "split") and s.layer == step.layer for s in before):
                    hit["destroyed"].add("a layer that ran no op")
    return hit

