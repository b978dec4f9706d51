"""Inputs, exact references, layouts and the tolerance model of generated cases (vectorised: sizes reach MiBs).

Every rank draws every member's input from the seed, so each computes the expected output itself. Integer,
bool, MIN/MAX and data-movement results are exact (bit for bit where nothing is computed: a movement case's whole
range starts with -0.0, a negative subnormal and both infinities, ``movement_specials``). Floating sums,
averages and products of inexact values are judged against a float64 reference with this tolerance model,
for ``n`` ranks and the dtype's unit roundoff ``u = eps / 2``:

- SUM: ``|got - ref| <= 2 n u sum|x_i| + tiny`` (a backend summing in any order in the dtype errs by at most
  ``(n - 1) u sum|x_i|``; the float64 reference of a float64 sum by as much again);
- AVG: the SUM bound divided by ``n``, plus ``2 u |ref|`` for the division;
- PRODUCT: ``|got - ref| <= 2 n u |ref| + tiny``.

``tiny`` is the dtype's smallest subnormal. Small-integer cases stay exact in every dtype (``reference.py``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from conformance.checks.cases import SPARSE, WIDE_TAIL, stable_seed

_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}
_THREAD = threading.local()  # each thread's generator (_rng)
_SPREAD = 0x9E3779B97F4A7C15F39CC0605CEDC835  # odd: seeds to far-apart 128-bit states, and PCG64's increment
_SIGN, _MANTISSA, _MANTISSA_HALF, _EXPONENT_BIAS = -(1 << 63), (1 << 52) - 1, 1 << 51, 1023  # float64's fields


def _int_range(dtype: torch.dtype, op: str | None, n: int) -> tuple[int, int]:
    """Inputs of ``dtype`` whose reduction by ``op`` over ``n`` ranks stays in range (uint8 wraps, exactly)."""
    info = torch.iinfo(dtype)
    if dtype == torch.uint8 or op in (None, "MIN", "MAX", "BAND", "BOR", "BXOR"):
        return info.min, info.max
    if op == "PRODUCT":
        m = round(info.max ** (1 / n))  # the largest m with m ** n <= max, from a float estimate
        while m**n > info.max:
            m -= 1
        while (m + 1) ** n <= info.max:
            m += 1
        return -m, m
    return -(info.max // n), info.max // n


def _float_exponents(dtype: torch.dtype, op: str | None, n: int) -> tuple[int, int]:
    """Binary exponents of inputs whose reduction over ``n`` ranks neither overflows nor underflows."""
    info = torch.finfo(dtype)
    top, low = math.floor(math.log2(info.max)), math.ceil(math.log2(info.tiny))
    if op == "PRODUCT":
        return low // n + 1, top // n - 1
    return low, top - n.bit_length() - 1


# "narrow" windows: every value of a tensor lies in one of these (both ends present, clipped to what the op
# keeps in range), at the edge of a smaller type (uint8, int8, uint16, int16, int32; bfloat16's and float16's
# exact integers) or all zero or all one value: what a backend sees that compacts a payload whose values fit
# a smaller type, or skips or folds a constant one, and a one-off guard of such a shortcut shows at the edge
NARROW_WINDOWS = ((0, 0), (7, 7), (0, 1), (0, 255), (0, 256), (-128, 127), (-129, 128), (0, 65535),
                  (0, 65536), (-32768, 32767), (-2048, 2048), (-2**31, 2**31 - 1), (-2**31 - 1, 2**31))


def replicated(case_seed: int) -> bool:
    """Whether every rank of a "narrow" case holds the same tensor (every third case, by its seed): identical
    contributions, as DDP's replicated parameters and agreed flags are, where a shortcut for equal inputs
    (returning one of them) shows for the ops that do not keep it (SUM, PRODUCT, AVG's rounding, BXOR)."""
    return stable_seed(case_seed, "replicated") % 3 == 0


def narrow_window(case_seed: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s window in a "narrow" case: the ranks of a case take consecutive windows (a backend
    decides how to ship each rank's payload alone), so one case at world size 4 tries four of them; in a
    ``replicated`` case every rank takes the first."""
    step = 0 if replicated(case_seed) else rank
    return NARROW_WINDOWS[(stable_seed(case_seed, "narrow") + step) % len(NARROW_WINDOWS)]


def draw(kind: str, dtype: torch.dtype, op: str | None, n: int, count: int, seed: int,
         window: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """``count`` values of ``dtype`` of value kind ``kind``, safe to reduce by ``op`` over ``n`` ranks (CPU);
    a "narrow" kind's values lie in ``window``."""
    rng = _rng(seed)
    if dtype == torch.bool:
        return _randint(0, 1, count, rng).bool()
    if kind == "small" or count == 0:
        return _draw_small(dtype, op, count, rng)
    if kind == "narrow":
        return _draw_narrow(dtype, op, n, count, window, rng)
    if not dtype.is_floating_point:
        return _draw_int(kind, dtype, op, n, count, rng)
    return _draw_float(kind, dtype, op, n, count, rng)


def _draw_small(dtype: torch.dtype, op: str | None, count: int, rng: np.random.Generator) -> torch.Tensor:
    """Small integers (powers of two for PRODUCT): exact through every op in every dtype."""
    if op == "PRODUCT":
        pick = torch.tensor([1.0, -1.0, 2.0, 0.5, -2.0] if dtype.is_floating_point else [1, -1, 2, 1, 1])
        vals = pick[_randint(0, 4, count, rng)]
        return vals.abs().to(dtype) if dtype == torch.uint8 else vals.to(dtype)
    return (_randint(1, 8, count, rng) if dtype == torch.uint8 else _randint(-4, 4, count, rng)).to(dtype)


def _draw_narrow(dtype: torch.dtype, op: str | None, n: int, count: int, window: tuple[int, int],
                 rng: np.random.Generator) -> torch.Tensor:
    """Integers in ``window`` clipped to the op's safe range, its top and bottom first (then uniform)."""
    if dtype.is_floating_point:
        top = 2.0 ** _float_exponents(dtype, op, n)[1]
        lo, hi = max(window[0], -top), min(window[1], top)
        lo, hi = math.ceil(lo), math.floor(hi)
    else:
        safe_lo, safe_hi = _int_range(dtype, op, n)
        lo, hi = max(window[0], safe_lo), min(window[1], safe_hi)
    lo = min(lo, hi)  # a window wholly above the safe range (every window reaches 0 or above): the safe top
    vals = _randint(lo, hi, count, rng)
    vals[: min(2, count)] = torch.tensor([hi, lo][: min(2, count)])
    return vals.to(dtype)


def _draw_int(kind: str, dtype: torch.dtype, op: str | None, n: int, count: int,
              rng: np.random.Generator) -> torch.Tensor:
    lo, hi = _int_range(dtype, op, n)
    if kind == "unsigned high" and dtype == torch.uint8:
        lo = 128
    if kind == "extremes":
        pick = torch.tensor(sorted({lo, hi, lo + 1, hi - 1, 0, max(lo, -1), min(hi, 1)}), dtype=torch.int64)
        vals = pick[_randint(0, len(pick) - 1, count, rng)]
        vals[: min(2, count)] = torch.tensor([lo, hi][: min(2, count)])
        return vals.to(dtype)
    return _randint(lo, hi, count, rng).to(dtype)


def _draw_float(kind: str, dtype: torch.dtype, op: str | None, n: int, count: int,
                rng: np.random.Generator) -> torch.Tensor:
    """sign x mantissa x 2 ** exponent (an exponent in the op's safe range), built as a float64 bit pattern from a
    random word (its sign bit and 52 mantissa bits) and a drawn exponent, then rounded to ``dtype``."""
    if op is None and kind == "full range":  # any finite bit pattern: subnormals, every mantissa bit
        size = torch.empty((), dtype=dtype).element_size()
        vals = _words(count, rng).to(_BITS[size]).view(dtype)  # the word's low bits
        vals = torch.where(torch.isfinite(vals), vals, torch.zeros((), dtype=dtype))
        first = movement_specials(dtype)[:count]
        vals[: first.numel()] = first
        return vals
    lo_e, hi_e = _float_exponents(dtype, op, n)
    if kind == "extremes":
        exps = torch.tensor([lo_e, hi_e, 0])[_randint(0, 2, count, rng)]
        exps[: min(2, count)] = torch.tensor([hi_e, lo_e][: min(2, count)])
        kept = _SIGN  # a mantissa of exactly 1
    else:
        exps = _randint(lo_e, hi_e, count, rng)
        kept = _SIGN | _MANTISSA
    bits = _words(count, rng) & kept
    if op == "PRODUCT":  # a mantissa of at most 1.5: (1.5 ** n) * 2 ** (top // n - 1) ** n stays below the max
        bits = (bits & _SIGN) | (bits & _MANTISSA).clamp_(max=_MANTISSA_HALF)
    return (bits | ((exps + _EXPONENT_BIAS) << 52)).view(torch.float64).to(dtype)


def nudged(vals: torch.Tensor, steps: int) -> torch.Tensor:
    """``vals`` moved ``steps`` units in the last place toward zero (integers: by ``steps``, stopping at 0), so
    that no value leaves the range its draw kept safe for an op: the "near" kind's rank r holds rank 0's draw moved
    r steps, and two ranks' tensors are unequal yet within any relative tolerance a shortcut might compare with."""
    if vals.dtype.is_floating_point:
        zero = torch.zeros_like(vals)
        for _ in range(steps):
            vals = torch.nextafter(vals, zero)
        return vals
    wide = vals.long()
    moved = torch.where(wide > 0, (wide - steps).clamp(min=0), (wide + steps).clamp(max=0))
    return moved.to(vals.dtype)


def movement_specials(dtype: torch.dtype) -> torch.Tensor:
    """The values a data-movement case's "full range" input starts with: bit patterns a random draw almost never
    gives and that arithmetic does not keep, so that a copy made by arithmetic shows (a broadcast as a SUM with
    zeros turns -0.0 into +0.0): -0.0, the negative smallest subnormal, +inf, -inf."""
    info = torch.finfo(dtype)
    return torch.tensor([-0.0, -info.smallest_normal * info.eps, math.inf, -math.inf], dtype=torch.float64).to(dtype)


def _rng(seed: int) -> np.random.Generator:
    """This thread's numpy PCG64 generator, set to the stream of ``seed``: about three times as fast per value as
    torch's CPU generator (a MiB case draws every member's input on every rank). Its 128-bit state is set from the
    seed directly: numpy's seeding through a SeedSequence costs 48 us, more than most draws' values."""
    gen = getattr(_THREAD, "rng", None)
    if gen is None:
        gen = _THREAD.rng = np.random.Generator(np.random.PCG64(0))
    gen.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": seed * _SPREAD % 2**128, "inc": _SPREAD},
                               "has_uint32": 0, "uinteger": 0}
    return gen


def _words(count: int, rng: np.random.Generator) -> torch.Tensor:
    """``count`` random int64 words, every bit uniform."""
    return torch.from_numpy(rng.bit_generator.random_raw(count).view(np.int64))


def _randint(lo: int, hi: int, count: int, rng: np.random.Generator) -> torch.Tensor:
    """Uniform int64 in [lo, hi] (inclusive; int64's whole range too)."""
    return torch.from_numpy(rng.integers(lo, hi, count, dtype=np.int64, endpoint=True))


SPARSE_ONE_IN = 16  # a SPARSE tensor holds about one non-zero element in this many


def wide_positions(case_seed: int, count: int) -> list[int]:
    """Where a WIDE_TAIL tensor of ``count`` values holds whole-range values: its last element and one drawn from
    its second half (a shortcut that samples a prefix, or the first and last elements, misses one of them)."""
    if count == 0:
        return []
    return sorted({count - 1, count // 2 + stable_seed(case_seed, "wide at") % max(1, count - count // 2)})


def inputs(case_seed: int, rank: int, kind: str, dtype: torch.dtype, op: str | None, n: int,
           count: int) -> torch.Tensor:
    """Rank ``rank``'s input for a case: every rank draws the same tensor for it. uint8 "unsigned high"
    values lie above 127 on even ranks and below 128 on odd ones, so reductions compare and carry across
    the sign bit a signed reading would see."""
    if kind == "narrow":
        seed_rank, window = (0 if replicated(case_seed) else rank), narrow_window(case_seed, rank)
        vals = draw(kind, dtype, op, n, count, stable_seed(case_seed, seed_rank), window)
    elif kind == "near":
        # a reduction's safe range for a movement too: no special value (inf) that no tolerance passes
        vals = nudged(draw("full range", dtype, op or "SUM", n, count, stable_seed(case_seed, 0)), rank)
    elif kind == WIDE_TAIL:
        vals = draw("narrow", dtype, op, n, count, stable_seed(case_seed, rank), narrow_window(case_seed, rank))
        wide = draw("full range", dtype, op, n, count, stable_seed(case_seed, rank, "wide"))
        at = wide_positions(case_seed, count)
        vals[at] = wide[at]
    elif kind == SPARSE:
        vals = draw("full range", dtype, op, n, count, stable_seed(case_seed, rank))
        kept = _randint(0, SPARSE_ONE_IN - 1, count, _rng(stable_seed(case_seed, rank, "sparse"))) == 0
        vals = torch.where(kept, vals, torch.tensor(0.0 if op else -0.0, dtype=vals.dtype))
    else:
        vals = draw(kind, dtype, op, n, count, stable_seed(case_seed, rank))
    if kind == "unsigned high" and dtype == torch.uint8 and rank % 2:
        vals = vals - 128
    return vals


@dataclass
class Expected:
    """The expected flat output, and the per-element tolerance (None: exact)."""

    values: torch.Tensor
    tolerance: torch.Tensor | None = None


def reduce(columns: Sequence[torch.Tensor], op: str, dtype: torch.dtype) -> Expected:
    """The reduction by ``op`` of the members' inputs (rank order), exact or with the tolerance model. Folded
    column by column into one accumulator (no stack of every member's widened copy: at MiB sizes that allocation
    and its page faults cost more than the arithmetic)."""
    if dtype == torch.bool:
        fold = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
                "PRODUCT": torch.logical_and, "MIN": torch.logical_and, "BAND": torch.logical_and,
                "BXOR": torch.logical_xor}[op]
        return Expected(_fold(columns, torch.bool, fold))
    if not dtype.is_floating_point:
        return _reduce_int(columns, op, dtype)
    return _reduce_float(columns, op, dtype)


def _fold(columns: Sequence[torch.Tensor], wide: torch.dtype, fn: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``fn(acc, column, out=acc)`` from the first column to the last, in ``wide`` (the columns are left as they
    are)."""
    acc = columns[0].to(wide, copy=True)
    for column in columns[1:]:
        fn(acc, column.to(wide), out=acc)
    return acc


def _reduce_int(columns: Sequence[torch.Tensor], op: str, dtype: torch.dtype) -> Expected:
    if op in ("SUM", "PRODUCT") and dtype == torch.uint8:  # wraps modulo 256, step by step
        step = torch.add if op == "SUM" else torch.mul
        def wrap(acc: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            return torch.bitwise_and(step(acc, x, out=out), 255, out=out)
        return Expected(_fold(columns, torch.int64, wrap).to(dtype))
    fn = {"SUM": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum,
          "BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
    return Expected(_fold(columns, torch.int64, fn).to(dtype))


def _reduce_float(columns: Sequence[torch.Tensor], op: str, dtype: torch.dtype) -> Expected:
    """float64 reference of the members' values (exact in float64 for MIN/MAX), with the tolerance model."""
    n = len(columns)
    if op in ("MIN", "MAX"):
        return Expected(_fold(columns, torch.float64, torch.minimum if op == "MIN" else torch.maximum).to(dtype))
    info = torch.finfo(dtype)
    u, tiny = info.eps / 2, info.smallest_normal * info.eps
    if op == "PRODUCT":
        ref = _fold(columns, torch.float64, torch.mul)
        return Expected(ref, 2 * n * u * ref.abs() + tiny)
    ref = _fold(columns, torch.float64, torch.add)
    spread = _fold([c.abs() for c in columns], torch.float64, torch.add)
    if op == "AVG":
        return Expected(ref / n, 2 * u * spread + 2 * u * (ref / n).abs() + tiny)
    return Expected(ref, 2 * n * u * spread + tiny)


def mismatch(got: torch.Tensor, want: Expected) -> str | None:
    """None when ``got`` (any layout) holds ``want``; else how many elements differ and the first four."""
    observed = got.detach().cpu().reshape(-1)
    expected = want.values.reshape(-1)
    if observed.numel() != expected.numel():
        return f"{expected.numel()} elements expected, {observed.numel()} observed"
    if want.tolerance is not None:
        bad = (observed.double() - expected).abs() > want.tolerance
        bad |= ~torch.isfinite(observed.double())
    elif observed.dtype.is_floating_point and observed.dtype == expected.dtype:  # bit for bit: -0.0 is not 0.0
        size = observed.element_size()
        bad = observed.contiguous().view(_BITS[size]) != expected.contiguous().view(_BITS[size])
    else:
        bad = observed != expected.to(observed.dtype)
    where = bad.nonzero().reshape(-1)
    if where.numel() == 0:
        return None
    first = where[:4].tolist()
    tol = "" if want.tolerance is None else f" (tolerance {[f'{want.tolerance[i].item():.3g}' for i in first]})"
    return (f"{where.numel()} of {expected.numel()} elements differ; at {first}: expected "
            f"{[expected[i].item() for i in first]}, observed {[observed[i].item() for i in first]}{tol}")


CANARY = {torch.bool: True}


def canary(dtype: torch.dtype) -> float | int | bool:
    """The fill around a view: a value no generated input takes in place of it (checked unchanged)."""
    return CANARY.get(dtype, 77)


@dataclass
class Placed:
    """A tensor in a layout: ``view`` is what the collective gets; ``backing`` holds it, with canaries."""

    view: torch.Tensor
    backing: torch.Tensor
    layout: str
    where: tuple[int, tuple[int, ...], tuple[int, ...], int] = field(init=False)

    def __post_init__(self) -> None:
        self.where = self._where()

    def _where(self) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
        v = self.view
        return v.untyped_storage().data_ptr(), tuple(v.shape), v.stride(), v.storage_offset()

    def rebound(self) -> str | None:
        """None when the view is still the memory it was made on (storage, shape, strides, offset), else what moved:
        a backend must write into the caller's tensor, not point it at a tensor of its own (``t.data = ...``,
        ``t.set_(...)``), which other views of that memory (DDP's bucket views, the caller's buffer) never see."""
        now = self._where()
        if now == self.where:
            return None
        names = ("storage address", "shape", "strides", "storage offset")
        moved = [f"{name} {a} -> {b}" for name, a, b in zip(names, self.where, now, strict=True) if a != b]
        return "the tensor no longer views the memory it was given: " + ", ".join(moved)

    def outside(self) -> torch.Tensor:
        """The backing's elements outside the view (each must still be the canary)."""
        index = torch.arange(self.backing.numel())  # the backing may itself start inside its storage (``slots``)
        inside = index.as_strided(self.view.shape, self.view.stride(),
                                  self.view.storage_offset() - self.backing.storage_offset())
        mask = torch.ones(self.backing.numel(), dtype=torch.bool)
        mask[inside.reshape(-1)] = False
        return self.backing.detach().cpu().reshape(-1)[mask]

    def canary_damage(self) -> str | None:
        """None when the elements around the view are untouched, else how many changed."""
        rest = self.outside()
        changed = (rest != canary(rest.dtype)).nonzero().reshape(-1)
        if changed.numel() == 0:
            return None
        return f"{changed.numel()} element(s) outside the {self.layout} view were overwritten"


def nd_shape(count: int) -> tuple[int, ...]:
    """A 3-D shape with ``count`` elements (0 elements: a 2 x 0 x 3 tensor)."""
    if count == 0:
        return (2, 0, 3)
    for d in (2, 3, 5, 7):
        if count % d == 0:
            rest = count // d
            e = next((e for e in (2, 3) if rest % e == 0), 1)
            return (d, e, rest // e)
    return (1, count, 1)


def nchw_shape(count: int) -> tuple[int, int, int, int]:
    """A 1 x C x H x W shape with ``count`` elements, C and H * W at least 2 where ``count`` has a factor
    (3, 2, 5 or 7) that leaves them so; else 1 x count x 1 x 1 (a prime count: no channel order to get wrong)."""
    for c in (3, 2, 5, 7):
        if count % c == 0 and count // c >= 2:
            hw = count // c
            h = next((h for h in (2, 3, 5, 7) if hw % h == 0 and hw // h >= 1), 1)
            return (1, c, h, hw // h)
    return (1, count, 1, 1)


def place(flat: torch.Tensor, layout: str, device: object, shape: tuple[int, ...] | None = None) -> Placed:
    """``flat``'s values in ``layout`` on ``device``: flat, N-D (``shape``, else ``nd_shape``), at a non-zero
    storage offset, strided (every other element of a wider buffer, from offset 1), transposed (a 2-D
    transpose: non-contiguous) or expanded (``flat``'s first value seen ``count`` times through stride 0, one
    memory location for every element: pass ``first_repeated(flat)`` so the values agree)."""
    count, dtype = flat.numel(), flat.dtype
    fill = canary(dtype)
    if layout == "flat":
        backing = flat.clone().to(device)
        return Placed(backing, backing, layout)
    if layout == "N-D":
        backing = flat.reshape(shape or nd_shape(count)).clone().to(device)
        return Placed(backing, backing, layout)
    if layout == "offset":
        backing = torch.full((count + 5,), fill, dtype=dtype, device=device)
        view = backing[3:3 + count]
    elif layout == "strided":
        backing = torch.full((2 * count + 2,), fill, dtype=dtype, device=device)
        view = backing[1:1 + 2 * count:2]
    elif layout == "channels_last":  # 4-D, memory in N, H, W, C order (CNN activations): dense, not contiguous
        backing = torch.empty(nchw_shape(count), dtype=dtype, device=device).contiguous(
            memory_format=torch.channels_last)
        backing.copy_(flat.reshape(backing.shape).to(device))
        return Placed(backing, backing, layout)
    elif layout == "expanded":  # an input only: an op cannot write to it (stride 0, as `torch.tensor(v).expand(n)`)
        backing = (flat[:1] if count else torch.full((1,), fill, dtype=dtype)).clone().to(device)
        return Placed(backing.expand(count), backing, layout)
    elif layout == "transposed":
        a, *rest = nd_shape(count)
        b = 1
        for r in rest:
            b *= r
        backing = torch.full((b, a), fill, dtype=dtype, device=device)
        view = backing.t()
        view.copy_(flat.reshape(a, b).to(device))
        return Placed(view, backing, layout)
    else:
        raise KeyError(f"no layout {layout!r}")
    view.copy_(flat.to(device))
    return Placed(view, backing, layout)


def first_repeated(flat: torch.Tensor) -> torch.Tensor:
    """``flat``'s first value at every position: the values of its ``expanded`` placement."""
    return flat[:1].expand(flat.numel()).clone() if flat.numel() else flat


def empty_like_layout(count: int, dtype: torch.dtype, layout: str, device: object,
                      shape: tuple[int, ...] | None = None) -> Placed:
    """An output of ``count`` elements in ``layout``, filled with the canary (so an untouched output shows)."""
    return place(torch.full((count,), canary(dtype), dtype=dtype), layout, device, shape)


SLOT_GAP = 3  # canary elements before, between and after the slots of one buffer


def one_buffer(out_count: int, flat_in: torch.Tensor, device: object) -> tuple[Placed, Placed]:
    """An output of ``out_count`` canaries and an input holding ``flat_in``, disjoint views of one flat buffer (the
    output first, then ``SLOT_GAP`` canaries, the input and ``SLOT_GAP`` more): one storage, no shared element. Each
    backing holds its view and the gaps beside it, so a write past either view shows."""
    count, dtype = flat_in.numel(), flat_in.dtype
    start = out_count + SLOT_GAP
    buffer = torch.full((start + count + SLOT_GAP,), canary(dtype), dtype=dtype, device=device)
    buffer[start:start + count] = flat_in.to(device)
    return (Placed(buffer[:out_count], buffer[:start], "output (in one buffer with the input)"),
            Placed(buffer[start:start + count], buffer[out_count:], "input (in one buffer with the output)"))


def empty_slots(k: int, count: int, dtype: torch.dtype, layout: str, device: object,
                shape: tuple[int, ...] | None = None) -> list[Placed]:
    """``k`` outputs of ``count`` elements for a list-form op, filled with the canary. In the ``offset`` layout they
    are slots of one buffer, ``SLOT_GAP`` canaries apart (as users chunk one buffer into a list): each slot's backing
    is its stretch of the buffer with the gaps around it, so a backend that writes the span from the first slot to
    the last, or the whole buffer, damages a gap. Other layouts: ``k`` tensors of their own."""
    if layout != "offset":
        return [empty_like_layout(count, dtype, layout, device, shape) for _ in range(k)]
    step = count + SLOT_GAP
    buffer = torch.full((SLOT_GAP + k * step,), canary(dtype), dtype=dtype, device=device)
    slots = []
    for j in range(k):
        start = SLOT_GAP + j * step
        slots.append(Placed(buffer[start:start + count], buffer[start - SLOT_GAP:start + count + SLOT_GAP],
                            f"offset (slot {j} of {k} in one buffer)"))
    return slots
