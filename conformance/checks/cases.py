"""Seeded case generation for the data checks: the same cases on every rank, from the seed and the world size.

A ``Plan`` names the dimensions of one family of cases (sizes, dtypes, value kinds, layouts, roots, tags,
block counts...) and each dimension's boundary values. ``Plan.cases`` always holds every boundary value of
every dimension (each in at least one case, the other dimensions drawn from the seed), then ``budget``
random samples per plan. Nothing here reads rank-local state: every rank derives the same list.

The seed and budget come from the CLI (``--seed``, ``--budget``) or the pytest options, through the
environment the rank processes inherit (``Generation.from_env``); the report records them.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

ENV_SEED = "CONFORMANCE_SEED"
ENV_BUDGET = "CONFORMANCE_BUDGET"
DEFAULT_SEED = 23  # fixed, so reference reports and CI are reproducible; --seed explores others
DEFAULT_BUDGET = 2  # random samples per plan on top of the boundary cases

KIB, MIB = 1024, 1024 * 1024
# Sizes in bytes around the points real stacks switch algorithm or protocol at (the simulator's inline
# payload limit of 64 KiB, NCCL's LL/LL128/Simple and ring/tree switches in the tens of KiB to MiB,
# 4 MiB buffers), each with a tail of elements on either side.
SIZE_BOUNDARIES: tuple[tuple[str, int, int], ...] = (  # (label, bytes, tail in elements)
    ("0", 0, 0), ("1", 0, 1), ("odd 3", 0, 3), ("not divisible by n", 0, -1),
    ("4KiB-1e", 4 * KIB, -1), ("4KiB", 4 * KIB, 0), ("64KiB-1e", 64 * KIB, -1), ("64KiB", 64 * KIB, 0),
    ("64KiB+1e", 64 * KIB, 1), ("1MiB+1e", MIB, 1), ("4MiB+3e", 4 * MIB, 3),
)
BIG_LABELS = ("1MiB+1e", "4MiB+3e")  # the costly ones: in a plan's boundary cases only where it says so
TINY = ("0", "1")  # the sizes every kind of a plan meets (a count divided by, a shape indexed, a loop not run)
# Sampled sizes reach this at the default budget, and past the largest boundary, to LARGE_SAMPLE_MAX_BYTES,
# with a larger budget (a longer run).
SAMPLE_MAX_BYTES = MIB + 7
LARGE_SAMPLE_MAX_BYTES = 16 * MIB + 7

INT_DTYPES = (torch.int64, torch.int32, torch.int8, torch.uint8)
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
ALL_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)
# Value kinds of generated cases ("unsigned high" applies to uint8 only, "narrow" to every dtype but bool, "near"
# to NEAR_DTYPES). "small" (exact small integers, as the hand-picked cases use) is no plan's value: only what the
# shrinker tries. So every generated case carries its dtype's extremes or whole range, or every value of a tensor
# lies in one narrow window at a smaller type's edge (data.NARROW_WINDOWS), or the ranks hold one whole-range tensor
# a few units in the last place apart (data.nudged), or (WIDE_TAIL) a narrow tensor but for its last value and one
# other in its second half, which take the whole range (a property of the whole tensor judged from a leading
# sample shows), or (SPARSE, floating dtypes) mostly zeros, and each dtype meets each kind.
WIDE_TAIL = "narrow, wide tail"
# SPARSE: one element in data.SPARSE_ONE_IN from the whole range, at positions each rank draws (so ranks overlap in
# some), every other element zero: -0.0 where the op moves data (a copy keeps the sign bit), +0.0 where it reduces
# (the sign of a sum of zeros is the implementation's: torch's sum of two -0.0 is +0.0). Where a backend ships or
# reduces a mostly-zero tensor by its non-zeros, its encoding shows (a -0.0 taken for zero, an index scatter that
# does not accumulate). At 64 KiB (thousands of elements: past a sparse path's own threshold) or sampled sizes.
SPARSE = "sparse"
VALUE_KINDS = ("extremes", "full range", "unsigned high", "narrow", "near", WIDE_TAIL, SPARSE)
# the boundary sizes WIDE_TAIL is drawn with (and any sampled one): a head of hundreds of values, past any sample a
# shortcut would take, at a few KiB (the larger sizes meet the other kinds)
_WIDE_TAIL_SIZES = ("4KiB-1e", "4KiB")
_SPARSE_SIZES = ("64KiB-1e", "64KiB", "64KiB+1e")
# where values a few units apart pass a tolerance (torch.allclose's rtol 1e-5: float32's ulp is 1.2e-7, int32's
# whole-range values are about 1e9): a shortcut that compares approximately shows there, not in 8- or 16-bit types
NEAR_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


def values_apply(kind: str, dtype: torch.dtype, size: str | None = None) -> bool:
    """Whether value kind ``kind`` means something for ``dtype`` (bool has one range) and, where given, a tensor
    of size label ``size`` (WIDE_TAIL needs room for a head, SPARSE thousands of elements)."""
    if kind == WIDE_TAIL:
        return dtype != torch.bool and (size is None or size in _WIDE_TAIL_SIZES or size.startswith("~"))
    if kind == SPARSE:
        return dtype.is_floating_point and (size is None or size in _SPARSE_SIZES or size.startswith("~"))
    if kind == "unsigned high":
        return dtype == torch.uint8
    if kind == "near":
        return dtype in NEAR_DTYPES
    return kind != "narrow" or dtype != torch.bool


CONTIGUOUS_LAYOUTS = ("flat", "N-D", "offset")
NONCONTIGUOUS_LAYOUTS = ("strided", "transposed", "channels_last")


@dataclass(frozen=True)
class Generation:
    """The seed and budget of one run; every rank reads the same values."""

    seed: int = DEFAULT_SEED
    budget: int = DEFAULT_BUDGET

    @classmethod
    def from_env(cls) -> Generation:
        """The values the front door exported (``to_env``), else the defaults."""
        return cls(int(os.environ.get(ENV_SEED, DEFAULT_SEED)), int(os.environ.get(ENV_BUDGET, DEFAULT_BUDGET)))

    @contextmanager
    def exported(self) -> Iterator[None]:
        """Set them in this process's environment, which the rank processes it starts inherit; restored after."""
        saved = {k: os.environ.get(k) for k in (ENV_SEED, ENV_BUDGET)}
        os.environ[ENV_SEED], os.environ[ENV_BUDGET] = str(self.seed), str(self.budget)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def to_json(self) -> dict[str, int]:
        """The report's ``generation`` field."""
        return {"seed": self.seed, "budget": self.budget}

    def reproduce(self) -> str:
        """The flags that give these cases again."""
        return f"--seed {self.seed} --budget {self.budget}"


def stable_seed(*parts: Any) -> int:
    """A 32-bit seed from ``parts`` that every process computes alike (no PYTHONHASHSEED dependence)."""
    return zlib.crc32(repr(parts).encode())


@dataclass(frozen=True)
class Case:
    """One generated case: a value per dimension, and its index in the plan (which seeds its data)."""

    plan: str
    index: int
    dims: tuple[tuple[str, Any], ...]
    boundary: bool = True

    def __getitem__(self, dim: str) -> Any:
        return dict(self.dims)[dim]

    def with_(self, **changes: Any) -> Case:
        """The same case (same data seed) with some dimensions changed: a shrink candidate."""
        merged = dict(self.dims)
        merged.update(changes)
        return replace(self, dims=tuple(merged.items()))

    def describe(self) -> str:
        kind = "boundary" if self.boundary else "sampled"
        return f"{self.plan} case {self.index} ({kind}): " + ", ".join(f"{k}={show(v)}" for k, v in self.dims)


def show(value: Any) -> str:
    """A dimension value as the report and the coverage table print it (``float32``, ``64KiB+1e``)."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        return "/".join(show(v) for v in value)
    return str(value)


Valid = Callable[[dict[str, Any]], bool]


def _dims_first(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pairwise entry with its first member as a tuple of dimensions."""
    first, *rest = entry
    return ((first,) if isinstance(first, str) else tuple(first), *rest)


@dataclass
class Plan:
    """Dimensions with their boundary values; ``valid`` filters combinations (an op a dtype lacks).

    ``samplers`` draw a random value for a dimension (a size in bytes past the boundaries); a dimension
    without one samples among its boundary values. ``core`` narrows the values the free dimensions of a
    boundary case are drawn from (the ops and dtypes every backend must run), so that a boundary value is
    not spent on a combination a backend may decline. Values in ``alone`` (the MiB sizes: the costliest)
    get a case of their own, the other dimensions drawn from ``core``.
    """

    name: str
    dims: dict[str, tuple[Any, ...]]
    valid: Valid = lambda d: True
    samplers: dict[str, Callable[[random.Random, Generation], Any]] = field(default_factory=dict)
    core: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    alone: tuple[Any, ...] = BIG_LABELS
    # dimension pairs whose every valid value pair is a boundary case; a third entry narrows the second
    # dimension to those values (every kind with the empty size); a first entry that is a tuple of dimensions
    # pairs every combination of theirs (every kind from every root with a size past 64 KiB)
    pairwise: tuple[tuple[Any, ...], ...] = ()

    def cases(self, gen: Generation, world_size: int) -> list[Case]:
        """Every boundary value of every dimension at least once, packed: each case takes the next pending
        value of every dimension it can (a seeded order), so a plan needs about as many boundary cases as its
        longest dimension has values; then ``gen.budget`` sampled cases."""
        rng = random.Random(stable_seed(gen.seed, world_size, self.name))
        pending = {d: [v for v in rng.sample(values, len(values)) if v not in self.alone]
                   for d, values in self.dims.items()}
        pairs = [(*zip(a, va), (b, vb)) for a, b, *only in map(_dims_first, self.pairwise)
                 for va in itertools.product(*(self.dims[d] for d in a))
                 for vb in (only[0] if only else self.dims[b])
                 if vb not in self.alone and not any(v in self.alone for v in va)]
        pairs = rng.sample(pairs, len(pairs))
        combos: list[dict[str, Any]] = []
        while any(pending.values()) or pairs:
            wanted = dict(pairs[0]) if pairs else {}
            wanted.update({d: p[0] for d, p in pending.items() if p and d not in wanted})
            combo = self._packed(rng, gen, wanted)
            if pairs and (combo is None or any(combo[d] != v for d, v in pairs[0])):
                pairs.pop(0)  # a pair no valid combination holds (an op a dtype lacks): not a case
                continue
            if combo is None:  # the first pending value fits no combination at all: drop it
                first = next(d for d, p in pending.items() if p)
                pending[first].pop(0)
                continue
            combos.append(combo)
            pairs = [p for p in pairs if any(combo[d] != v for d, v in p)]
            for d, value in combo.items():
                if value in pending[d]:
                    pending[d].remove(value)
        for dim, values in self.dims.items():
            combos += [c for v in values if v in self.alone and (c := self._complete(rng, gen, {dim: v}))]
        out = [Case(self.name, i, tuple(c.items())) for i, c in enumerate(combos)]
        for _ in range(gen.budget):
            combo = self._complete(rng, gen, {}, sample=True)
            if combo is not None:
                out.append(Case(self.name, len(out), tuple(combo.items()), boundary=False))
        return out

    def _packed(self, rng: random.Random, gen: Generation, wanted: dict[str, Any]) -> dict[str, Any] | None:
        """A valid combination holding as many of ``wanted`` as it can: all, else all but one (the last
        dimensions given up first), and so on; the first two dimensions' values (a pair) always."""
        keys = list(wanted)
        while keys:
            for skip in [None, *reversed(keys[2:])]:
                combo = self._complete(rng, gen, {k: wanted[k] for k in keys if k != skip},
                                       tries=20 if len(keys) > 1 else 400)
                if combo is not None:
                    return combo
            keys.pop()
        return None

    def _complete(self, rng: random.Random, gen: Generation, fixed: dict[str, Any], sample: bool = False,
                  tries: int = 200) -> dict[str, Any] | None:
        for attempt in range(tries):  # redraw the free dimensions until the combination is valid
            combo = {}
            for dim, values in self.dims.items():
                if dim in fixed:
                    combo[dim] = fixed[dim]
                elif sample and dim in self.samplers:
                    combo[dim] = self.samplers[dim](rng, gen)
                else:
                    narrow = not sample and attempt < tries // 2
                    combo[dim] = rng.choice(self.core.get(dim, values) if narrow else values)
            if self.valid(combo):
                return combo
        return None

    def coverage(self, cases: Sequence[Case]) -> dict[str, list[str]]:
        """Per dimension, the boundary values that ``cases`` hit (in the plan's order)."""
        return {dim: [show(v) for v in values if any(c[dim] == v for c in cases)]
                for dim, values in self.dims.items()}


def sizes(big: bool = True) -> tuple[str, ...]:
    """The size boundary labels (the two costliest only when ``big``)."""
    return tuple(label for label, _, _ in SIZE_BOUNDARIES if big or label not in BIG_LABELS)


def sample_size(rng: random.Random, gen: Generation) -> str:
    """A random size label: bytes log-uniform up to SAMPLE_MAX_BYTES (LARGE_SAMPLE_MAX_BYTES with a budget
    above the default), with a tail of -1..+3 elements."""
    top = SAMPLE_MAX_BYTES if gen.budget <= DEFAULT_BUDGET else LARGE_SAMPLE_MAX_BYTES
    nbytes = int(2 ** rng.uniform(0, math.log2(top)))
    return f"~{nbytes}B{rng.randint(-1, 3):+d}e"


MAX_SMALL_ITEM_ELEMENTS = 300_000  # 1- and 2-byte dtypes stop here: 4 MiB of bool is 4 M elements


MAX_BOOL_ELEMENTS = 70_000  # bool reductions are the slowest per element (the simulator's among them)


def affordable(label: str, dtype: torch.dtype, world_size: int) -> bool:
    """Whether a size is run with ``dtype``: the MiB sizes with 4- and 8-byte dtypes only (time budget)."""
    count = numel(label, dtype, world_size)
    if dtype == torch.bool:
        return count <= MAX_BOOL_ELEMENTS
    return _itemsize(dtype) >= 4 or count <= MAX_SMALL_ITEM_ELEMENTS


def numel(label: str, dtype: torch.dtype, world_size: int) -> int:
    """Elements of ``dtype`` for a size label (``"64KiB+1e"``, a sampled ``"~1234B+2e"``)."""
    if label == "not divisible by n":
        return 5 * world_size + 1 if world_size > 1 else 5
    if label.startswith("~"):
        nbytes, tail = label[1:].split("B")
        return max(0, int(nbytes) // _itemsize(dtype) + int(tail.removesuffix("e")))
    for name, nbytes, tail in SIZE_BOUNDARIES:
        if name == label:
            return max(0, nbytes // _itemsize(dtype) + tail)
    raise KeyError(f"no size {label!r}")


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def smaller_sizes(label: str, dtype: torch.dtype, world_size: int) -> Iterator[str]:
    """Boundary size labels below ``label``'s element count, smallest first (shrink candidates)."""
    limit = numel(label, dtype, world_size)
    seen = set()
    for name, _, _ in SIZE_BOUNDARIES:
        count = numel(name, dtype, world_size)
        if count < limit and count not in seen:
            seen.add(count)
            yield name
