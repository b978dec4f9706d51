"""Generated programs: seeded sequences of collectives and P2P, interleaved over several live groups.

The data checks judge each op alone. A backend keeps state between ops (sequence numbers, store keys, buffers,
caches per group or per pair), and a bug there shows only when ops of several kinds, groups, sizes and shapes
follow one another, some of them async and still outstanding while others run, completed in an order other
than the order they were issued in and through another API than ``wait()``, or run again on the same buffers.
A program is such a sequence, drawn from the seed: every rank draws the same steps (``draw_program``); each
rank draws its own completion order. Every value is exact (``values``): inputs are integers from (step, sending
rank, element) that every reduction over the group keeps exact in the step's dtype, so every rank computes
what each member receives.

This module is the generator (no process group needed); ``program_steps`` issues one step and says what its
tensors must hold, ``program_runs`` runs programs on every rank and shrinks a failing one.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from conformance.checks.cases import stable_seed
from conformance.checks.common import UNSUPPORTED
from conformance.checks.reference import dtype_name

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
         "all_to_all_single", "all_gather", "gather", "scatter", "barrier", "ring", "pair", "coalesced")
P2P = ("ring", "pair")  # kinds that need two members
# what a _coalescing_manager block holds (two ops of one of these: torch coalesces each of them)
BLOCK_KINDS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
REDUCING = ("all_reduce", "reduce", "reduce_scatter_tensor")
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.float16, torch.int8,
          torch.uint8)
NUMELS = (1, 2, 3, 8, 33, 257, 4099, 70001)  # elements per rank (per block where the op has blocks)
NUMEL_WEIGHTS = (5, 4, 4, 4, 3, 3, 2, 1)
# the shape of each rank's piece ("0-d": one element); a tensor that joins the
# members' pieces (all_gather_into_tensor's output, all_to_all_single's, reduce_scatter_tensor's input) joins
# them along dim 0 (a 0-d piece: one element each)
SHAPES = ("flat", "flat", "0-d", "2-D", "3-D")
# how this rank completes an async step: Work.wait(), the Work's future (wait(), a callback chained on it that
# reads the outputs, torch.futures.wait_all), or polling Work.is_completed() without ever waiting (c10d's
# isCompleted: true once the op has run, its outputs written; at the program's end, once every member has issued
# every step); a backend without futures for a kind says so (optional-op rule)
FINISHES = ("wait", "wait", "future", "then", "wait_all", "poll")
POLL_S = 5.0  # how long a polled step may take to report is_completed() once every member issued it
# int32 and int64 values sit this far from 0 (by the sender's rank mod 3), past float32's and float64's exact
# integers: an accumulation through a float type shows; sums of 8 ranks still fit
OFFSETS = {torch.int32: 2**27, torch.int64: 2**53}
# the largest integer each dtype holds exactly, and all below it (a float's 2**mantissa digits; an int's maximum)
EXACT = {torch.float32: 2**24, torch.float64: 2**53, torch.bfloat16: 2**8, torch.float16: 2**11,
         torch.int64: 2**63 - 1, torch.int32: 2**31 - 1, torch.int8: 127, torch.uint8: 255}
REDUCE_OPS = ("SUM", "SUM", "MIN", "MAX", "PRODUCT", "AVG", "BAND", "BOR", "BXOR")  # AVG: floats; bitwise: ints
BITWISE = ("BAND", "BOR", "BXOR")
TAGS = (0, 1, 7, 2**31 - 1)
STEPS = 16  # per program
PROGRAMS = 6  # at the default budget; one more per unit of budget above it
ASYNC_SHARE = 0.5
AGAIN_SHARE = 0.25  # steps run a second time on the same buffers, refilled in place
SENTINEL = -99  # what an output holds before the op writes it, and the guards around every tensor always (uint8: 255)
GUARD = 3  # elements of SENTINEL either side of every tensor a step passes
AGAIN = 100_000  # the second run of a step sends the values of step index + AGAIN


@dataclass(frozen=True)
class Step:
    """One op of a program: its kind (``inner``: a coalesced block's ops), group (index into the program's
    groups), dtype, elements per rank (or per block), shape of a rank's piece, reduce op, root (a member's
    index), tag, whether it is async and how an async one is completed, whether it runs a second time on the
    same buffers, and its index in the drawn program (which seeds its data, so a shrunk program sends the same
    values)."""

    index: int
    kind: str
    group: int
    dtype: torch.dtype
    numel: int
    op: str
    root: int
    tag: int
    is_async: bool
    shape: str = "flat"
    finish: str = "wait"
    inner: str = "all_reduce"
    again: bool = False

    @property
    def reduces(self) -> bool:
        """Whether the step's op takes a reduce op."""
        return self.kind in REDUCING or (self.kind == "coalesced" and self.inner in REDUCING)

    def describe(self, groups: list[list[int]]) -> str:
        """'#3 all_reduce group [0, 1] int32 8 el 2-D SUM async (future)'."""
        members = groups[self.group]
        kind = f"coalesced {self.inner} x2" if self.kind == "coalesced" else self.kind
        parts = [f"#{self.index} {kind}", f"group {members}", dtype_name(self.dtype), f"{self.numel} el"]
        if (shape := piece_shape(self, self.numel)) != (self.numel,):
            parts.append("0-d" if not shape else f"{self.shape} {tuple(shape)}")
        if self.reduces:
            parts.append(self.op)
        if self.kind in ("broadcast", "reduce", "gather", "scatter"):
            parts.append(f"root {members[self.root % len(members)]}")
        if self.kind in P2P and self.tag:
            parts.append(f"tag {self.tag}")
        parts.append(f"async ({self.finish})" if self.is_async else "sync")
        if self.again:
            parts.append("then again on the same buffers")
        return " ".join(parts)


def program_partitions(world_size: int) -> list[list[list[int]]]:
    """The groups programs draw from, as partitions of the ranks (sorted global ranks; empty parts dropped): the
    world again as a group of its own, both halves, odd and even ranks, rank 0 and the ranks above it, and the
    first and last rank with the ranks between them. Each partition is made in one go
    (``program_runs.make_partition``)."""
    ranks = list(range(world_size))
    half = max(1, world_size // 2)
    ends = sorted({0, world_size - 1})
    shapes = [[ranks], [ranks[:half], ranks[half:]], [ranks[0::2], ranks[1::2]], [ranks[:1], ranks[1:]],
              [ends, [r for r in ranks if r not in ends]]]
    return [[part for part in parts if part] for parts in shapes]


def program_groups(world_size: int) -> list[list[int]]:
    """Every group a program may use, as the index ``Step.group`` names: the world, then each partition's parts."""
    return [list(range(world_size))] + [part for parts in program_partitions(world_size) for part in parts]


def possible_kinds(world_size: int) -> tuple[str, ...]:
    """The kinds a world of ``world_size`` can run: P2P kinds need two ranks."""
    return tuple(k for k in KINDS if k not in P2P or world_size > 1)


def draw_program(seed: int, number: int, groups: list[list[int]], tags: bool, offered: tuple[str, ...]) -> list[Step]:
    """Program ``number`` of the run with ``seed``, of the ``offered`` kinds: the same steps on every rank."""
    return _draw(seed, number + 1, groups, tags, offered)[number]


def all_programs(seed: int, budget: int, groups: list[list[int]], tags: bool,
                 offered: tuple[str, ...]) -> list[list[Step]]:
    """Every program a run with ``seed`` and ``budget`` draws: PROGRAMS, and one more per unit of budget above 2."""
    return _draw(seed, PROGRAMS + max(0, budget - 2), groups, tags, offered)


def _draw(seed: int, count: int, groups: list[list[int]], tags: bool, offered: tuple[str, ...]) -> list[list[Step]]:
    """The first ``count`` programs. Kinds come from a deck per program (each once before any twice), reduce ops
    from one deck for the whole run (each once before any twice: SUM twice), each size once in the run's first
    steps that are not 0-d (then by NUMEL_WEIGHTS), blocks' ops in turn, and a reducing
    step's dtype and group fit its op (AVG: a floating dtype, a group of 1, 2, 4 or 8; bitwise: an integer dtype)."""
    ops_rng, ops = random.Random(stable_seed(seed, "reduce ops")), []
    sizes = list(NUMELS)
    ops_rng.shuffle(sizes)
    blocks = ops_rng.randrange(len(BLOCK_KINDS))
    pairs = [i for i, g in enumerate(groups) if len(g) > 1]
    powers = [i for i, g in enumerate(groups) if len(g) in (1, 2, 4, 8)]
    programs = []
    for number in range(count):
        rng = random.Random(stable_seed(seed, "program", number, tuple(map(tuple, groups))))
        steps: list[Step] = []
        kinds: list[str] = []
        for index in range(STEPS):
            if not kinds:
                kinds = [k for k in offered if k not in P2P or pairs]
                rng.shuffle(kinds)
            kind, inner = kinds.pop(), BLOCK_KINDS[0]
            if kind == "coalesced":  # the blocks' ops in turn over the run
                inner, blocks = BLOCK_KINDS[blocks % len(BLOCK_KINDS)], blocks + 1
            op, dtypes, group_from = "SUM", DTYPES, range(len(groups))
            if kind in REDUCING or (kind == "coalesced" and inner in REDUCING):
                if not ops:
                    ops = list(REDUCE_OPS)
                    ops_rng.shuffle(ops)
                op = ops.pop()
                dtypes = tuple(d for d in DTYPES if (d.is_floating_point or op != "AVG")
                               and (not d.is_floating_point or op not in BITWISE))
                group_from = powers if op == "AVG" else group_from
            shape, numel = rng.choice(SHAPES), rng.choices(NUMELS, NUMEL_WEIGHTS)[0]
            if shape != "0-d" and sizes:  # every size once in the run, then by weight
                numel = sizes.pop()
            steps.append(Step(index=index, kind=kind, group=rng.choice(pairs if kind in P2P else group_from),
                              dtype=rng.choice(dtypes), numel=1 if shape == "0-d" else numel, op=op,
                              root=rng.randrange(8), tag=rng.choice(TAGS) if tags else 0,
                              is_async=rng.random() < ASYNC_SHARE, shape=shape,
                              finish=rng.choice(FINISHES), inner=inner,
                              again=kind != "barrier" and rng.random() < AGAIN_SHARE))
        programs.append(steps)
    return programs


def piece_shape(step: Step, count: int) -> tuple[int, ...]:
    """The shape of a rank's piece of ``count`` elements under the step's shape."""
    if step.shape == "0-d" and count == 1:
        return ()
    rows = next((d for d in (2, 3, 5, 7) if count % d == 0 and count > d), 1)
    if step.shape == "2-D":
        return (rows, count // rows)
    if step.shape == "3-D":
        return (rows, 1, count // rows)
    return (count,)


def joined_shape(step: Step, pieces: int, count: int) -> tuple[int, ...]:
    """The shape of ``pieces`` pieces of ``count`` elements joined along dim 0."""
    piece = piece_shape(step, count)
    return (pieces,) if not piece else (pieces * piece[0], *piece[1:])


def values(step: Step, sender: int, start: int, count: int, size: int) -> torch.Tensor:
    """Elements ``start``.. (``count`` of them) of what global rank ``sender`` contributes to ``step`` on a group
    of ``size`` members, as int64: integers whose reduction by the step's op over the group the step's dtype holds
    exactly. |v| is at most 30 and at most the dtype's largest exact integer (EXACT) over ``size`` (uint8: 0 to
    that); int32 and int64 values are shifted from 0 by OFFSETS (less on groups above 8); for PRODUCT 1, -1 and,
    from the first four ranks only, 2 and -2: every product within 16."""
    base = step.index * 37 + sender * 11 + torch.arange(start, start + count, dtype=torch.int64) * 5
    if step.op == "PRODUCT":
        factor = torch.tensor((1, -1, 2, -2))[base % (4 if sender < 4 else 2)]
        return factor.abs() if step.dtype == torch.uint8 else factor
    span = min(30, EXACT[step.dtype] // size // (2 if step.dtype in OFFSETS else 1))
    if step.dtype == torch.uint8:
        return base % (span + 1)
    shift = OFFSETS[step.dtype] if step.dtype in OFFSETS and size <= 8 else EXACT.get(step.dtype, 0) // (4 * size)
    return base % (2 * span + 1) - span + (shift if step.dtype in OFFSETS else 0) * (sender % 3 - 1)


FOLDS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "SUM": lambda s: s.sum(0), "MIN": lambda s: s.amin(0), "MAX": lambda s: s.amax(0),
    "AVG": lambda s: s.sum(0).double() / s.shape[0], "PRODUCT": lambda s: s.prod(0),
    "BAND": lambda s: functools.reduce(torch.bitwise_and, s), "BOR": lambda s: functools.reduce(torch.bitwise_or, s),
    "BXOR": lambda s: functools.reduce(torch.bitwise_xor, s),
}


def reduced(op: str, columns: list[torch.Tensor]) -> torch.Tensor:
    """The exact reduction by ``op`` of the members' inputs (one int64 tensor each), element by element: int64
    (AVG: float64, exact for a group of 1, 2, 4 or 8)."""
    return FOLDS[op](torch.stack(columns))


def refusal_words(op: str | None, dtype: torch.dtype) -> tuple[str, ...]:
    """What a refusal of a step must name: that the op is unsupported, the op where it is one some backends lack
    (PRODUCT, AVG and the bitwise ones: gloo's 'Cannot use ReduceOp.AVG with Gloo'), or the dtype by a name no
    other error carries by chance (not 'Int' or 'Long')."""
    words = [*UNSUPPORTED, dtype_name(dtype)]
    if op not in (None, "SUM", "MIN", "MAX"):
        words.append(f"ReduceOp.{op}")
        words.append(op)
    return (*words, *{torch.bfloat16: ("BFloat16",), torch.float16: ("Half",)}.get(dtype, ()))


def sentinel(dtype: torch.dtype) -> int:
    """SENTINEL in ``dtype`` (255 for uint8, which has no -99): never a value a step sends or computes."""
    return 255 if dtype == torch.uint8 else SENTINEL


def dimensions() -> dict[str, tuple[str, ...]]:
    """Every value each dimension of a step can take, as the coverage table names them."""
    return {"kind": KINDS, "dtype": tuple(dtype_name(d) for d in DTYPES), "numel": tuple(map(str, NUMELS)),
            "shape": tuple(dict.fromkeys(SHAPES)), "reduce op": tuple(dict.fromkeys(REDUCE_OPS)),
            "block of": BLOCK_KINDS, "completion": ("sync", *dict.fromkeys(FINISHES)), "again": ("once", "again")}


def coverage(steps: list[Step]) -> dict[str, set[str]]:
    """The values of each dimension ``steps`` hit (a reduce op only on a step that reduces, a block's op only on
    a coalesced step)."""
    hit: dict[str, set[str]] = {dim: set() for dim in dimensions()}
    for step in steps:
        hit["kind"].add(step.kind)
        hit["dtype"].add(dtype_name(step.dtype))
        hit["numel"].add(str(step.numel))
        hit["shape"].add(step.shape)
        hit["completion"].add(step.finish if step.is_async else "sync")
        hit["again"].add("again" if step.again else "once")
        if step.reduces:
            hit["reduce op"].add(step.op)
        if step.kind == "coalesced":
            hit["block of"].add(step.inner)
    return hit

