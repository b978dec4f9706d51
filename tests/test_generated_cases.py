"""The case generator, the exact references and tolerance model, layouts, and the shrinker (one process)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from conformance import cli, inputs
from conformance.checks import cases as gc
from conformance.checks import data
from conformance.checks.cases import Generation, Plan
from conformance.checks.common import Findings
from conformance.checks.coverage import plans, rows
from conformance.checks.generated import run_plan
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_every_plan_hits_every_boundary_value(world_size: int) -> None:
    missed = [(req, dim, gone) for req, _, _, dim, _, gone in rows(Generation(budget=0), world_size) if gone]
    assert not missed


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_kind_meets_the_empty_size_and_every_root_a_large_one(world_size: int) -> None:
    from conformance.checks import coalescing_cases, collective_cases

    for plan, dim in ((collective_cases.ALL_REDUCE, "op"), (collective_cases.GATHER, "kind"),
                      (collective_cases.IN_PLACE, "kind"), (collective_cases.ALLTOALL, "splits"),
                      (coalescing_cases.PLAN, "kind")):
        cases = plan.cases(Generation(budget=0), world_size)
        assert {(c[dim], c["size"]) for c in cases if c["size"] in gc.TINY} == {
            (v, size) for v in plan.dims[dim] for size in gc.TINY}, plan.name
    rooted = collective_cases.rooted_plan(world_size, True).cases(Generation(budget=0), world_size)
    assert {(c["kind"], c["root"]) for c in rooted if c["size"] == "64KiB+1e"} == {
        (kind, root) for kind in ("broadcast", "reduce") for root in range(world_size)}


def test_cases_depend_on_seed_and_world_size_only() -> None:
    plan = plans(4)["COLL-ALLREDUCE-OPS"][0][0]
    first = plan.cases(Generation(seed=5, budget=3), 4)
    assert first == plan.cases(Generation(seed=5, budget=3), 4)
    assert [c for c in first if not c.boundary] != [c for c in plan.cases(Generation(seed=6, budget=3), 4)
                                                    if not c.boundary]
    assert len([c for c in first if not c.boundary]) == 3
    assert len(plan.cases(Generation(seed=5, budget=0), 4)) == len([c for c in first if c.boundary])


def test_sizes_reach_past_the_protocol_thresholds() -> None:
    counts = {label: gc.numel(label, torch.float32, 4) for label in gc.sizes()}
    assert counts["0"] == 0 and counts["1"] == 1 and counts["not divisible by n"] % 4
    assert counts["64KiB+1e"] * 4 > 64 * 1024 and counts["4MiB+3e"] * 4 > 4 * 1024 * 1024


def test_seeded_inputs_are_the_same_in_every_process_and_cover_the_range() -> None:
    a = data.inputs(9, 1, "extremes", torch.int64, "MAX", 4, 100)
    assert torch.equal(a, data.inputs(9, 1, "extremes", torch.int64, "MAX", 4, 100))
    info = torch.iinfo(torch.int64)
    assert a.min().item() == info.min and a.max().item() == info.max
    high = data.inputs(9, 0, "unsigned high", torch.uint8, "SUM", 4, 100)
    assert high.min().item() >= 128 and data.inputs(9, 1, "unsigned high", torch.uint8, "SUM", 4, 100).max() < 128
    summable = data.inputs(9, 0, "extremes", torch.int32, "SUM", 4, 100)
    assert summable.long().abs().max().item() * 4 <= torch.iinfo(torch.int32).max


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.float32,
                                   torch.bfloat16, torch.float16])
def test_narrow_inputs_fill_each_ranks_window_to_both_ends(dtype: torch.dtype) -> None:
    windows = set()
    for case_seed in range(40):
        for rank in range(4):
            window = data.narrow_window(case_seed, rank)
            windows.add(window)
            vals = data.inputs(case_seed, rank, "narrow", dtype, "SUM", 4, 50).double()
            lo, hi = vals.min().item(), vals.max().item()
            ends = list(window)
            if dtype.is_floating_point:  # as the dtype rounds them
                ends = torch.tensor(window, dtype=torch.float64).to(dtype).double().tolist()
            assert ends[0] <= lo and hi <= ends[1], (window, lo, hi)
            # where the dtype holds the window exactly and SUM over 4 ranks stays in range: both ends drawn
            info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
            if ends == list(window) and info.min <= window[0] * 4 and window[1] * 4 <= info.max:
                assert (lo, hi) == window, (window, lo, hi)
        first = data.inputs(case_seed, 0, "narrow", dtype, "SUM", 4, 50)
        same = all(torch.equal(first, data.inputs(case_seed, r, "narrow", dtype, "SUM", 4, 50)) for r in (1, 3))
        assert same == data.replicated(case_seed)
        assert (data.narrow_window(case_seed, 1) == data.narrow_window(case_seed, 0)) == data.replicated(case_seed)
    assert windows == set(data.NARROW_WINDOWS)
    assert 8 <= sum(map(data.replicated, range(40))) <= 20  # about every third case


def test_narrow_values_apply_to_every_dtype_but_bool() -> None:
    assert gc.values_apply("narrow", torch.int8) and not gc.values_apply("narrow", torch.bool)
    assert not gc.values_apply("unsigned high", torch.int64) and gc.values_apply("extremes", torch.bool)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64, torch.uint8])
def test_wide_tail_inputs_are_narrow_but_for_the_last_value_and_one_in_the_second_half(dtype: torch.dtype) -> None:
    for case_seed in range(12):
        for count in (2, 17, 512, 1023):
            at = data.wide_positions(case_seed, count)
            assert count - 1 in at and all(count // 2 <= k < count for k in at) and len(at) <= 2
            for rank in range(4):
                vals = data.inputs(case_seed, rank, gc.WIDE_TAIL, dtype, "SUM", 4, count)
                window = data.narrow_window(case_seed, rank)
                narrow = data.draw("narrow", dtype, "SUM", 4, count, gc.stable_seed(case_seed, rank), window)
                head = [k for k in range(count) if k not in at]
                assert torch.equal(vals[head], narrow[head])  # the head is a narrow draw in the rank's window
                if dtype == torch.int64:
                    assert all(window[0] <= vals[k].item() <= window[1] for k in head)
    # a float64 head of small integers is float32-exact; the wide values are not (a narrowing decided on a
    # sample of the head would round them)
    vals = data.inputs(5, 0, gc.WIDE_TAIL, torch.float64, None, 2, 512)
    at = data.wide_positions(5, 512)
    assert not torch.equal(vals[at].float().double(), vals[at])
    assert data.inputs(5, 0, gc.WIDE_TAIL, torch.float64, None, 2, 0).numel() == 0


def test_wide_tail_applies_at_a_few_kib_and_sampled_sizes_to_every_dtype_but_bool() -> None:
    assert gc.values_apply(gc.WIDE_TAIL, torch.float64, "4KiB-1e")
    assert gc.values_apply(gc.WIDE_TAIL, torch.int8, "~900B+1e")
    assert not gc.values_apply(gc.WIDE_TAIL, torch.float64, "odd 3")
    assert not gc.values_apply(gc.WIDE_TAIL, torch.float64, "64KiB+1e")
    assert not gc.values_apply(gc.WIDE_TAIL, torch.bool, "4KiB")


@pytest.mark.parametrize("dtype", gc.NEAR_DTYPES)
@pytest.mark.parametrize("op", [None, "SUM", "MAX", "PRODUCT"])
def test_near_inputs_differ_between_ranks_within_a_tolerance_and_stay_in_the_ops_range(dtype, op) -> None:
    ranks = [data.inputs(11, r, "near", dtype, op, 4, 200) for r in range(4)]
    for r in range(1, 4):
        assert (ranks[r] != ranks[0]).float().mean() > 0.9  # unequal element by element (0 stays 0)
        if not dtype.is_floating_point:  # r steps of 1 toward zero (a small integer is not within any rtol)
            assert ((ranks[r].long() - ranks[0].long()).abs() <= r).all()
        elif op != "PRODUCT":  # products keep small integers, which no relative tolerance spans
            assert torch.allclose(ranks[r].double(), ranks[0].double(), rtol=1e-5, atol=1e-8)
        assert (ranks[r].double().abs() <= ranks[0].double().abs()).all()  # toward zero: inside the draw's range
    assert not gc.values_apply("near", torch.bfloat16) and not gc.values_apply("near", torch.bool)


def test_float_tolerance_admits_any_summation_order_and_rejects_a_dropped_rank() -> None:
    columns = [data.inputs(3, r, "full range", torch.bfloat16, "SUM", 8, 4096) for r in range(8)]
    want = data.reduce(columns, "SUM", torch.bfloat16)
    for order in (range(8), reversed(range(8)), (3, 1, 7, 0, 2, 6, 4, 5)):
        acc = torch.zeros(4096, dtype=torch.bfloat16)
        for r in order:
            acc = acc + columns[r]  # rounded to bfloat16 at every step
        assert data.mismatch(acc, want) is None
    dropped = sum(c.float() for c in columns[1:]).to(torch.bfloat16)
    assert data.mismatch(dropped, want) is not None


def test_data_movement_is_judged_bit_for_bit() -> None:
    want = data.Expected(torch.tensor([-0.0, 1.0]))
    assert data.mismatch(torch.tensor([-0.0, 1.0]), want) is None
    assert "1 of 2 elements differ" in data.mismatch(torch.tensor([0.0, 1.0]), want)


@pytest.mark.parametrize("layout", ["N-D", "offset", "strided", "transposed"])
def test_layouts_hold_the_values_and_guard_their_surroundings(layout: str) -> None:
    flat = torch.arange(12, dtype=torch.float32)
    placed = data.place(flat, layout, "cpu")
    assert torch.equal(placed.view.reshape(-1), flat) and placed.canary_damage() is None
    assert placed.view.is_contiguous() == (layout in ("N-D", "offset"))
    if layout == "offset":
        assert placed.view.storage_offset() > 0
        placed.backing[0] = 1.0
        assert "outside the offset view" in placed.canary_damage()


@pytest.mark.parametrize("layout", ["flat", "N-D", "offset", "strided", "transposed"])
def test_a_view_pointed_at_other_memory_is_seen(layout: str) -> None:
    """What a backend that installs its result with t.data = ... or t.set_(...) leaves: the values may read right
    through the caller's tensor object, but its memory (and every other view of it) never got them."""
    flat = torch.arange(12, dtype=torch.float32)
    for install in (lambda v, r: setattr(v, "data", r), lambda v, r: v.set_(r)):
        placed = data.place(flat, layout, "cpu")
        assert placed.rebound() is None
        placed.view.copy_((flat + 1).reshape(placed.view.shape))  # written in place: the memory it was given
        assert placed.rebound() is None
        install(placed.view, (flat + 2).reshape(placed.view.shape).contiguous())
        assert "no longer views the memory it was given" in placed.rebound()


def _ctx() -> CheckContext:
    requirement = SimpleNamespace(id="TEST-GENERATED")
    return CheckContext(0, 1, SimpleNamespace(), dist.HashStore(), requirement, 5.0,  # type: ignore[arg-type]
                        generation=Generation(seed=1, budget=4))


def test_the_first_failure_is_shrunk_to_the_smallest_failing_size_and_named_with_the_seed() -> None:
    ctx = _ctx()
    plan = Plan("demo", {"size": gc.sizes(), "layout": ("flat", "offset")}, samplers={"size": gc.sample_size})

    def run_one(case: gc.Case) -> None:  # a backend wrong above 64 KiB, in any layout
        if gc.numel(case["size"], torch.float32, 1) * 4 > 64 * 1024:
            raise CheckFailed(f"rank 0: wrong at {case['size']}")

    found = Findings(ctx)
    run_plan(ctx, found, plan, run_one, [0], "world")
    smallest = found.failures[0]
    assert "seed 1" in smallest and "--seed 1 --budget 4" in smallest
    assert "size=64KiB+1e, layout=flat" in smallest and "wrong at 64KiB+1e" in smallest
    assert any("rank 0: generated demo:" in n for n in ctx.notes)


def test_a_passing_plan_records_no_failure() -> None:
    ctx = _ctx()
    found = Findings(ctx)
    run_plan(ctx, found, Plan("ok", {"size": gc.sizes()}), lambda case: None, [0], "world")
    assert not found.failures and found.raised is None


@pytest.mark.parametrize(("flag", "value"), [("--seed", "-1"), ("--seed", "x"), ("--budget", "-2")])
def test_bad_seed_or_budget_is_refused_before_anything_runs(flag: str, value: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--target", "sim", flag, value])
    assert stopped.value.code == cli.ExitCode.BAD_INPUT and value in capsys.readouterr().err
    with pytest.raises(inputs.InputError):
        (inputs.seed if flag == "--seed" else inputs.budget)(value)


class _Config:
    """The two calls of pytest.Config that the plugin's option check makes."""

    def __init__(self, **options: str) -> None:
        self.options = {"--conformance-targets": "sim", "--conformance-world-sizes": "2",
                        "--conformance-timeout": "30", "--conformance-report-dir": None,
                        "--conformance-seed": "23", "--conformance-budget": "2", **options}
        self.cleanups: list = []

    def getoption(self, name: str, default: object = None) -> object:
        return self.options.get(name, default)

    def add_cleanup(self, fn: object) -> None:
        self.cleanups.append(fn)


def test_pytest_options_export_the_generation_and_refuse_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance.pytest_plugin import _validate_options

    monkeypatch.delenv(gc.ENV_SEED, raising=False)
    config = _Config(**{"--conformance-seed": "7", "--conformance-budget": "0"})
    _validate_options(config)  # type: ignore[arg-type]
    assert Generation.from_env() == Generation(seed=7, budget=0)
    for cleanup in config.cleanups:
        cleanup()
    assert Generation.from_env() == Generation()
    with pytest.raises(pytest.UsageError, match="seed"):
        _validate_options(_Config(**{"--conformance-seed": "seven"}))  # type: ignore[arg-type]


def test_coalesced_views_of_one_buffer_keep_their_values_and_see_a_write_between_them() -> None:
    from conformance.checks.coalescing_cases import GAP, SharedBuffers

    tensors = [torch.arange(4, dtype=torch.float32), torch.tensor([7, 8], dtype=torch.int64),
               torch.arange(3, dtype=torch.float32) + 10]
    shared = SharedBuffers(tensors, rank=1)
    assert [v.tolist() for v in shared.views] == [t.tolist() for t in tensors]
    floats = shared.buffers[torch.float32]
    assert shared.views[0].data_ptr() == floats[GAP:].data_ptr() and floats.numel() == 4 + 3 + 3 * GAP
    shared.views[2].add_(1)  # an op writing its own tensor is no damage
    assert shared.damage() is None
    floats[GAP + 4] += 1  # the element right after the first view
    assert "1 float32 element(s) between the views" in (shared.damage() or "")


def test_misspelt_hint_keys_are_unknown_to_torchcomms_and_to_the_simulator() -> None:
    from conformance.checks.hints import near_miss_hints
    from conformance.torchcomms_hints import HINT_KEYS
    from simulator.config import KNOWN_HINTS

    slips = near_miss_hints()
    known = {key for keys in HINT_KEYS.values() for key in keys}
    assert {"maxctas", "MaxCTAs", "NETNAME", "net_name", "CGA_CLUSTER_SIZE"} <= set(slips)
    assert not set(slips) & (known | set(KNOWN_HINTS))
