"""Checks for hint propagation: options reach the communicator, on the NCCL and torchcomms paths."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks import warned
from conformance.checks.common import (
    config_part,
    effective_config,
    expect_allreduce_members,
    expect_raises,
    new_comms,
    options_part,
    positive_control,
    refusal_words,
)
from conformance.checks.first_ops import expect_first_op_makes_comm
from conformance.checks.option_bounds import OPTIONS, ctas_cases
from conformance.checks.option_trees import check_option_trees
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed, NotObservable
from conformance.probe import observing
from conformance.torch_compat import members_only_new_group_refused
from conformance.torchcomms_hints import HINT_KEYS

LAZY_INVALID_WAIT_S = 5.0  # the lazy world's timeout: a member that waits for a peer that refused fails soon


def _config(ctx: CheckContext, group: dist.ProcessGroup, what: str) -> dict[str, Any]:
    config = effective_config(ctx, group, what)
    if config is None:
        raise NotObservable(f"target {ctx.target.name} shows no communicator config for the group ({what})")
    return config


def expect_options(ctx: CheckContext, group: dist.ProcessGroup, what: str, expected: dict[str, Any]) -> None:
    """Every option in ``expected`` has its value in the group's effective config."""
    config = _config(ctx, group, what)
    for key, value in expected.items():
        ctx.expect_equal(f"{what}: effective {key}", value, config.get(key))


@check("HINT-INIT-OPTIONS")
def init_options(ctx: CheckContext) -> None:
    """Options given at init reach the world communicator; the caller's options object stays as it was."""
    options = options_part(ctx).make(**OPTIONS)
    before = options_part(ctx).read(options)
    world = ctx.init_world("eager", pg_options=options)
    expect_options(ctx, world, "init_process_group(pg_options=...)", OPTIONS)
    expect_untouched(ctx, options, before, "the caller's options object after init_process_group(pg_options=it)")


@check("HINT-NEWGROUP-OPTIONS")
def newgroup_options(ctx: CheckContext) -> None:
    """Options given to new_group reach its communicator, as a copy: the caller changing its options object
    afterwards (and passing it to a second group) leaves the first group's config alone, and making the group
    leaves the caller's object as it was; a new_group given no options gets the backend's defaults."""
    world = ctx.init_world("eager", pg_options=options_part(ctx).make(**OPTIONS))
    ranks = list(range(ctx.world_size))
    _no_options_given(ctx, world, ranks)
    options = options_part(ctx).make(**OPTIONS)
    before = options_part(ctx).read(options)
    group = dist.new_group(ranks, pg_options=options)
    expect_options(ctx, group, "new_group(pg_options=...)", OPTIONS)
    expect_allreduce_members(ctx, group, ranks, "new_group with options")
    expect_untouched(ctx, options, before, "the caller's options object after new_group(pg_options=it)")
    # two fields, one on the options object and one in an NCCL config; both valid values (a made-up net_name
    # is refused by NCCL's init: 'invalid usage', seen with torch 2.11 and NCCL 2.28.9)
    changed = {"max_ctas": OPTIONS["max_ctas"] + 1, "is_high_priority_stream": not OPTIONS["is_high_priority_stream"]}
    options_part(ctx).change(options, **changed)
    second = dist.new_group(ranks, pg_options=options)
    expect_options(ctx, second, "a second new_group given the changed options object", changed)  # positive control
    expect_options(ctx, group, "first new_group after the caller changed its options object", OPTIONS)
    expect_allreduce_members(ctx, group, ranks, "first new_group after the second was made")
    _hints_map_its_own(ctx, ranks)
    _subclass_options(ctx, ranks)


def _subclass_options(ctx: CheckContext, ranks: list[int]) -> None:
    """An instance of a caller's own subclass of the options class, holding OPTIONS, is options like any other:
    torch itself takes them by isinstance (v2.13.0 distributed_c10d.py:2183, v2.15.0 :776 and :813, for
    ProcessGroupNCCL.Options), so a backend that checks the exact type refuses what torch passes. Where the class
    cannot be subclassed, made without arguments or given the fields through ``change``, that is noted (the
    positive control: the instance must read back as OPTIONS before it is judged)."""
    cls = type(options_part(ctx).make())
    try:
        caller = type(f"Caller{cls.__name__}", (cls,), {})()
        options_part(ctx).change(caller, **OPTIONS)
        held = {k: v for k, v in options_part(ctx).read(caller).items() if k in OPTIONS}
    except Exception as exc:  # noqa: BLE001 - a class a caller cannot subclass and fill is not judged
        ctx.note(f"options given as a caller's subclass instance: not judged ({type(exc).__name__}: {exc})")
        return
    if held != OPTIONS:
        ctx.note(f"options given as a caller's subclass instance: not judged (the instance reads back {held})")
        return
    what = f"new_group(pg_options=an instance of {caller.__class__.__name__}, a caller's subclass of {cls.__name__})"
    try:
        group = dist.new_group(ranks, pg_options=caller)
    except Exception as exc:  # noqa: BLE001 - the finding: options torch passes on were refused
        raise CheckFailed(f"rank {ctx.rank}: {what}: expected the group made, observed {type(exc).__name__}: "
                          f"{exc}") from None
    expect_options(ctx, group, what, OPTIONS)
    expect_allreduce_members(ctx, group, ranks, what)


def _hints_map_its_own(ctx: CheckContext, ranks: list[int]) -> None:
    """Where an options object has a hints map (``hints``, a dict, as torchcomms' CommOptions has), a hint a caller
    sets in it in place belongs to that object: another object made with defaults before or after it holds none,
    and a new_group given no options gets none (a default hints map shared between objects carries it to both)."""
    made = options_part(ctx).make()
    hints = getattr(made, "hints", None)
    if not isinstance(hints, dict):
        ctx.note("options objects without a hints map: a hint set in place not judged")
        return
    earlier = options_part(ctx).make()
    hints["netName"] = OPTIONS["net_name"]
    later = options_part(ctx).make()
    with_it = dist.new_group(ranks, pg_options=made)
    seen = _config(ctx, with_it, "new_group given the object with a hint set in place").get("hints", {})
    ctx.expect_equal("a hint set in place on an options object: in the config of a group given that object (the "
                     "probe sees it)", OPTIONS["net_name"], seen.get("netName"))
    for label, other in (("made before it", earlier), ("made after it", later)):
        held = options_part(ctx).read(other).get("hints", {})
        ctx.expect("netName" not in held, f"an options object {label} with defaults, after a hint was set in place on "
                   "another: its hints", "no netName", held)
    plain = _config(ctx, dist.new_group(ranks), "new_group given no options").get("hints", {})
    ctx.expect("netName" not in plain, "a new_group given no options, after a hint was set in place on an options "
               "object: its config's hints", "no netName", plain)


def _no_options_given(ctx: CheckContext, world: dist.ProcessGroup, ranks: list[int]) -> None:
    """A new_group given no options gets what one given a default options object gets, not the world's options:
    torch hands the backend none (for NCCL it makes a fresh ProcessGroupNCCL.Options, v2.13.0
    distributed_c10d.py:2193-2196); where torch makes every new_group through split_group (torch 2.13's torchcomms
    routing, v2.13.0 :5836-5862), that split inherits the world's (:5656-5660) and is judged as a split. The world
    holds OPTIONS here, each field other than the default's, so a group that took them shows."""
    expect_options(ctx, world, "the world, given OPTIONS (what a group that took them would show)", OPTIONS)
    plain = dist.new_group(ranks)
    defaults = dist.new_group(ranks, pg_options=options_part(ctx).make())
    if members_only_new_group_refused(ctx.target.target.stack):
        ctx.note("new_group given no options: not judged here, where torch makes it with split_group (what a split "
                 "inherits is HINT-SPLIT-INHERIT-COPY's)")
        return
    want = {k: v for k, v in _config(ctx, defaults, "new_group given default options").items() if k in OPTIONS}
    expect_options(ctx, plain, "new_group given no options (the backend's defaults, as a new_group given a default "
                   "options object)", want)


@check("HINT-LAZY-SUBGROUP-OPTIONS")
def lazy_subgroup_options(ctx: CheckContext) -> None:
    """On a lazily initialised world, a subgroup's communicator, created at its first collective, has the
    options its new_group was given, and the world's communicator keeps its own."""
    world = ctx.init_world("lazy")
    ranks = list(range(ctx.world_size))
    upper = ranks[1:] or ranks
    groups = [(what, dist.new_group(members, pg_options=options_part(ctx).make(**OPTIONS)), members)
              for what, members in (("whole-world subgroup", ranks), (f"subgroup {upper}", upper))]
    for what, group, members in groups:
        if ctx.rank in members:
            _expect_config_before_comm(ctx, group, what)
    expect_allreduce_members(ctx, world, ranks, "lazy world")
    for what, group, members in groups:
        if ctx.rank in members:
            since = ctx.probe.mark()
            expect_allreduce_members(ctx, group, members, f"lazily created {what}")  # creates its communicator
            if observing("comm_created") in ctx.target.capabilities:  # the probe sees a creation (positive control)
                ctx.expect(bool(new_comms(ctx, since)), f"lazily created {what}: communicators made by its first "
                           "collective", "one", "none")
            expect_options(ctx, group, f"lazily created {what}, after its first collective", OPTIONS)
    world_config = _config(ctx, world, "lazy world")
    leaked = {k: world_config.get(k) for k in OPTIONS if world_config.get(k) == OPTIONS[k]}
    ctx.expect(not leaked, "the lazy world's config after its subgroups were given options", "defaults", leaked)
    if observing("comm_created") in ctx.target.capabilities:
        expect_first_op_makes_comm(ctx, ranks,
                                   lambda: dist.new_group(ranks, pg_options=options_part(ctx).make(**OPTIONS)))
        if ctx.world_size > 1:
            _pair_comms_take_options(ctx, ranks)


def _pair_comms_take_options(ctx: CheckContext, ranks: list[int]) -> None:
    """A lazy group given OPTIONS whose first op is a send from rank 0 to rank 1: the 2-rank communicators that
    makes carry the group's options too (ProcessGroupNCCL makes every communicator of a group, pair ones
    included, with the group's options_->config: initNCCLComm's NCCLComm::create(numRanks, rank, ncclID,
    options_->config)). Judged on the keys the group's own config shows with OPTIONS' values; where the target
    makes no pair communicator, or records no config with it, that is noted."""
    group = dist.new_group(ranks, pg_options=options_part(ctx).make(**OPTIONS))
    since = ctx.probe.mark()
    t = torch.arange(4, dtype=torch.float32, device=ctx.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the lazy-P2P warning: P2P-LAZY-WARN-ONCE's subject
        if ctx.rank == 0:
            dist.send(t, 1, group=group)
        elif ctx.rank == 1:
            dist.recv(t, 0, group=group)
    pairs = [e for e in new_comms(ctx, since) if e.get("mode") == "p2p"]
    shown = _config(ctx, group, "a lazy group given options, after its first P2P")
    keys = [k for k in OPTIONS if shown.get(k) == OPTIONS[k]]
    dist.barrier()
    if ctx.rank not in (0, 1):
        return
    if not pairs or not all(isinstance(e.get("config"), dict) for e in pairs):
        ctx.note("pair communicators' options not judged: the first P2P of a lazy group given options made no "
                 "pair communicator, or recorded none with its config")
        return
    for event in pairs:
        got = {k: event["config"].get(k) for k in keys}
        ctx.expect_equal(f"pair communicator {event.get('comm')} of a lazy group given options: its config, for the "
                         f"options the group's config shows ({keys})", {k: OPTIONS[k] for k in keys}, got)


def _expect_config_before_comm(ctx: CheckContext, group: dist.ProcessGroup, what: str) -> None:
    """Before a lazy group's first op its communicator does not exist: the target may show no config (None, as
    NCCL's log shows none), or the one the communicator will get, which is the group's options; never an error.
    Reading it observes and does not act: it makes no communicator (a hook that made the lazy one would change what
    the group's first op does, e.g. its P2P would find a communicator and make no pair one)."""
    watched = observing("comm_created") in ctx.target.capabilities
    since = ctx.probe.mark() if watched else 0
    try:
        config = effective_config(ctx, group, what)
    except CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - any error reading the config of a group without a communicator
        raise CheckFailed(f"rank {ctx.rank}: {what}: reading the effective config before its first collective "
                          f"raised {type(exc).__name__}: {exc}") from None
    if watched:
        ctx.expect_equal(f"{what}: communicators made by reading its effective config before its first collective",
                         [], new_comms(ctx, since))
    if config is None:
        ctx.note(f"{what}: no effective config shown before its first collective (no communicator yet)")
        return
    for key, value in OPTIONS.items():
        ctx.expect_equal(f"{what}: effective {key} before its first collective (the config it will get)", value,
                         config.get(key))


@check("HINT-SPLIT-OPTIONS")
def split_options(ctx: CheckContext) -> None:
    """Options given to split_group reach the child communicator; the caller's options object stays as it was."""
    ctx.init_world("eager")
    options = options_part(ctx).make(**OPTIONS)
    before = options_part(ctx).read(options)
    child = dist.split_group(split_ranks=[list(range(ctx.world_size))], pg_options=options)
    expect_options(ctx, child, "split_group(pg_options=...)", OPTIONS)
    expect_untouched(ctx, options, before, "the caller's options object after split_group(pg_options=it)")


@check("HINT-SPLIT-INHERIT-COPY")
def split_inherit_copy(ctx: CheckContext) -> None:
    """A child split without options copies the parent's; changing it leaves the parent alone."""
    world = ctx.init_world("eager", pg_options=options_part(ctx).make(**OPTIONS))
    child = dist.split_group(split_ranks=[list(range(ctx.world_size))])
    expect_options(ctx, child, "split_group child without options", OPTIONS)
    options_part(ctx).mutate(child, max_ctas=OPTIONS["max_ctas"] + 1, net_name="changed-by-child")
    parent = options_part(ctx).fields(world)
    mutated = options_part(ctx).fields(child)
    positive_control(ctx, mutated.get("net_name") == "changed-by-child",
                     "the change made to the child's options object in the child's own options")
    changed = {k: parent.get(k) for k in ("max_ctas", "net_name") if parent.get(k) != OPTIONS[k]}
    ctx.expect(not changed, "parent's options after the child's options object was changed", "unchanged", changed)


# the second torchcomms group: the first option left unset (its default, False), the others set, so that
# each later option is shown to arrive on its own
LATER_OPTIONS = {k: v for k, v in OPTIONS.items() if k != "is_high_priority_stream"}


@check("HINT-TORCHCOMMS-OPTIONS")
def torchcomms_options(ctx: CheckContext) -> None:
    """On the torchcomms path, options arrive as hints under names torchcomms reads (or are refused): the
    world's (every option set), then a new group's (the first option unset)."""
    try:
        world = ctx.init_world("eager", pg_options=options_part(ctx).make(**OPTIONS), path="torchcomms")
    except (ValueError, TypeError, NotImplementedError) as exc:
        _refused(ctx, exc)
        return
    _expect_hints(ctx, world, "torchcomms world", OPTIONS)
    try:
        group = dist.new_group(list(range(ctx.world_size)), pg_options=options_part(ctx).make(**LATER_OPTIONS))
    except (ValueError, TypeError, NotImplementedError) as exc:
        _refused(ctx, exc)
        return
    _expect_hints(ctx, group, "torchcomms new_group", LATER_OPTIONS)


def _refused(ctx: CheckContext, exc: Exception) -> None:
    """A refusal of the options on the torchcomms path must name one, and must not call a valid value invalid."""
    text = str(exc)
    if not any(key in text for keys in HINT_KEYS.values() for key in keys) and "pg_options" not in text:
        raise CheckFailed(f"rank {ctx.rank}: init on the torchcomms path raised {type(exc).__name__}: {exc}, "
                          "which names no option: not a refusal of the options") from None
    if "invalid" in text.lower():  # every value of OPTIONS is within NCCL's bounds
        raise CheckFailed(f"rank {ctx.rank}: the torchcomms path called valid options {OPTIONS} invalid: "
                          f"{type(exc).__name__}: {exc}") from None
    ctx.note(f"options refused loudly on the torchcomms path: {type(exc).__name__}: {exc}")


def _expect_hints(ctx: CheckContext, group: dist.ProcessGroup, what: str, options: dict[str, Any]) -> None:
    hints = _config(ctx, group, f"{what} comm").get("hints") or {}
    for option, value in options.items():
        keys = HINT_KEYS[option]
        found = {k: hints[k] for k in keys if k in hints}
        wanted = str(value).lower()
        ok = any(str(v).lower() == wanted for v in found.values())
        ctx.expect(ok, f"{what}: option {option}={value!r} as a CommOptions hint under {list(keys)}",
                   wanted, found or f"absent (hints: {dict(hints)})")


@check("HINT-INVALID-REFUSED")
def invalid_refused(ctx: CheckContext) -> None:
    """Invalid option and hint values are refused naming key and value (min_ctas and max_ctas: every pair of
    0, 1 and 2 NCCL refuses, option_bounds)."""
    ctx.init_world("eager")
    ranks = list(range(ctx.world_size))
    cases = [
        ({"cga_cluster_size": -1}, "cga_cluster_size", "-1"),
        ({"max_ctas": "many"}, "max_ctas", "many"),
        ({"min_ctas": 8, "max_ctas": 4}, "min_ctas", "8"),
        ({"cga_cluster_size": 9}, "cga_cluster_size", "9"),  # above NCCL's maximum cluster size of 8
    ]
    if "hints" in ctx.target.capabilities:
        cases += [({"hints": hints}, key, value) for key, value in INVALID_HINTS
                  for hints in (in_company({key: value}) if value == INVALID_HINTS_IN_COMPANY.get(key)
                                else [{key: value}])]
        cases += [({"hints": {key: value}}, key, value) for key, value in INVALID_TYPED_HINTS]
    else:
        ctx.note("hint values not checked: the target lacks capability hints (a hints map on its options); "
                 "a backend whose options carry one declares hints")
    needles = [(fields, (str(value), refusal_words(ctx, key, key))) for fields, key, value in cases]
    needles += [(case.fields, (case.refused_value, tuple(w for k in case.refused_keys
                                                          for w in refusal_words(ctx, k, k))))
                for case in ctas_cases() if not case.valid]
    for fields, contains in needles:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the unknown keys of in_company: HINT-UNKNOWN-WARN's subject
            expect_raises(ctx, f"new_group with invalid option {fields}",
                          lambda f=fields: dist.new_group(ranks, pg_options=options_part(ctx).make(**f)),
                          (ValueError, TypeError, RuntimeError), contains)
        with warnings.catch_warnings():  # the same values set on a valid object after it was made (NCCL's style)
            warnings.simplefilter("ignore")
            expect_raises(ctx, f"new_group with options made valid, then set to {fields}",
                          lambda f=fields: dist.new_group(ranks, pg_options=_set_late(ctx, f)),
                          (ValueError, TypeError, RuntimeError), contains)
    for label, foreign in FOREIGN_OPTIONS:  # not the backend's options type: refused, never read as defaults
        expect_raises(ctx, f"new_group with pg_options {label}",
                      lambda f=foreign: dist.new_group(ranks, pg_options=f),
                      (ValueError, TypeError, AssertionError, RuntimeError), (("options", "type"),))
    expect_allreduce_members(ctx, dist.group.WORLD, ranks, "world after refused options")
    _invalid_on_lazy_groups(ctx, ranks, needles[:2])
    if "hints" in ctx.target.capabilities:  # the valid boundary of the inconsistent case: accepted
        edge = {"minCTAs": "4", "maxCTAs": "4"}
        group = dist.new_group(ranks, pg_options=options_part(ctx).make(hints=edge))
        expect_allreduce_members(ctx, group, ranks, f"new_group with hints {edge} (minCTAs equal to maxCTAs)")
        _valid_hints_as_values(ctx, ranks)


# Valid hint values given as Python values, not text. torchcomms' hints are a map of strings (CommOptions::hints,
# comms/torchcomms/TorchCommOptions.hpp:22 at meta-pytorch/torchcomms 59426ba; bound as such by pybind11,
# TorchCommPy.cpp:135, whose map caster refuses a non-string value): a backend takes them as the same text, or
# refuses them naming the hint, never carries an int or a bool into its communicator's hints
VALUE_HINTS: dict[str, Any] = {"maxCTAs": 4, "minCTAs": 2, "cgaClusterSize": 2, "is_high_priority_stream": True}


def _valid_hints_as_values(ctx: CheckContext, ranks: list[int]) -> None:
    """A new_group given ``VALUE_HINTS`` is refused naming a hint key, or works and, where the target shows its
    config (``observe:config``), gets the hints config a new_group given the same values as text (``str(value)``:
    the control, made first) gets."""
    text = {key: str(value) for key, value in VALUE_HINTS.items()}
    control = dist.new_group(ranks, pg_options=options_part(ctx).make(hints=text))
    what = f"new_group with hints given as Python values {VALUE_HINTS}"
    try:
        group = dist.new_group(ranks, pg_options=options_part(ctx).make(hints=dict(VALUE_HINTS)))
    except (ValueError, TypeError, RuntimeError) as exc:
        ctx.expect(any(key in str(exc) for key in VALUE_HINTS), f"{what}: refused, naming the hint",
                   f"an error naming one of {sorted(VALUE_HINTS)}", f"{type(exc).__name__}: {exc}")
        return
    expect_allreduce_members(ctx, group, ranks, what)
    if "observe:config" not in ctx.target.capabilities:
        ctx.note(f"{what}: accepted and working; its config not compared (the target shows none: observe:config)")
        return
    try:
        expected = _config(ctx, control, f"new_group with hints {text} (the control)").get("hints", {})
        observed = _config(ctx, group, what).get("hints", {})
    except NotObservable as exc:
        ctx.note(f"{what}: accepted and working; its config not compared: {exc}")
        return
    ctx.expect_equal(f"{what}: its config's hints (as the same values given as text give: {expected})",
                     expected, observed)
    ctx.expect_equal(f"{what}: the types of its config's hints",
                     {k: type(v).__name__ for k, v in expected.items()},
                     {k: type(v).__name__ for k, v in observed.items()})


def _set_late(ctx: CheckContext, fields: dict[str, Any]) -> Any:
    """An options object made with no fields (valid), then given ``fields`` by assignment, as NCCL's users set
    ``opts.config.max_ctas`` after ``ProcessGroupNCCL.Options()`` (NCCL checks the config when the communicator is
    made, ncclCommInitRankConfig): a backend that validates only in its constructor lets these through. A refusal
    at the assignment itself is a refusal too (``expect_raises`` judges what it says)."""
    options = options_part(ctx).make()
    options_part(ctx).change(options, **fields)
    return options


# pg_options a backend cannot use: the fields as a dict, as text, an object of no options type. torch refuses them
# for NCCL before the backend runs ('Expected backend_options argument to be of type ProcessGroupNCCL.Options',
# v2.13.0 distributed_c10d.py:2183); a backend of its own options type refuses them itself
FOREIGN_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("as a dict {'max_ctas': 4}", {"max_ctas": 4}), ("as the text 'max_ctas=4'", "max_ctas=4"),
    ("as a plain object()", object()),
)

# Invalid values of each typed hint torchcomms maps into ncclConfig_t (torchcomms facts: typed reads throw
# 'Invalid hint value for key'): not a number, empty, negative (NCCL refuses cgaClusterSize < 0 and minCTAs or
# maxCTAs <= 0 in src/init.cc, the cga check just before the min/max CTAs one, seen in several NCCL versions'
# init.cc through search; so a parser that takes a sign must still refuse them), and a boolean outside
# 1/true/yes/y/0/false/no/n. One value per key is also tried among other hints (in_company).
INVALID_HINTS: tuple[tuple[str, str], ...] = (
    *((key, value) for key in ("maxCTAs", "minCTAs", "cgaClusterSize") for value in ("lots", "-4", "")),
    ("is_high_priority_stream", "maybe"), ("is_high_priority_stream", ""),
)
# The same kinds of value given as Python numbers rather than text (torchcomms' hints are a map of strings; a
# backend that takes other types must not let them past its checks): a negative int, a float, an int that is no
# boolean
INVALID_TYPED_HINTS: tuple[tuple[str, Any], ...] = (("maxCTAs", -4), ("cgaClusterSize", 2.5),
                                                   ("is_high_priority_stream", 2))
INVALID_HINTS_IN_COMPANY = {"maxCTAs": "lots", "minCTAs": "-4", "cgaClusterSize": "-4",
                            "is_high_priority_stream": "maybe"}

# what an invalid hint may sit among: an unknown key (warned about and ignored) and a valid known hint
_COMPANY = ({"cfmUnknownHint": "1"}, {"netName": OPTIONS["net_name"]})


def in_company(bad: dict[str, str]) -> list[dict[str, str]]:
    """An invalid hint alone, after each companion, before them all, and between them (a validator that stops
    at the first unknown or valid key, or reads only the first entry, accepts the invalid one)."""
    unknown, valid = _COMPANY
    return [dict(bad), {**unknown, **bad}, {**valid, **bad}, {**bad, **unknown, **valid}, {**unknown, **bad, **valid}]


def _invalid_on_lazy_groups(ctx: CheckContext, ranks: list[int], needles: list[tuple[dict[str, Any], Any]]) -> None:
    """A group of a lazily initialised world (no device bound) given invalid options: refused at new_group, or,
    where the backend makes the communicator at the group's first collective and validates there (as NCCL does:
    ProcessGroupNCCL keeps the config as given and ncclCommInitRankConfig checks it when the communicator is
    made), by that collective, on every member, naming key and value; never accepted by both. The group is made
    on a new lazy world of the same ranks (every rank destroys the bound one first)."""
    dist.barrier()
    dist.destroy_process_group()
    ctx.init_world("lazy", timeout_s=LAZY_INVALID_WAIT_S)
    for fields, contains in needles:
        what = f"lazy world: new_group with invalid option {fields}, then its first all_reduce"

        def make_and_use(f: dict[str, Any] = fields) -> None:
            group = dist.new_group(ranks, pg_options=options_part(ctx).make(**f))
            dist.all_reduce(torch.ones(2, device=ctx.device), group=group)

        expect_raises(ctx, what, make_and_use, (ValueError, TypeError, RuntimeError), contains)
        dist.barrier()


def expect_untouched(ctx: CheckContext, options: Any, before: dict[str, Any], what: str) -> None:
    """The caller's options object still holds what it held before (``before``: ``OptionsPart.read``): a backend
    copies what it keeps, and never changes the object a caller may pass to its next group."""
    after = options_part(ctx).read(options)
    changed = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    ctx.expect(not changed, f"{what}: fields changed (before, after)", "none", changed)


@check("HINT-UNKNOWN-WARN")
def unknown_warn(ctx: CheckContext) -> None:
    """Unknown hint keys warn, naming the key (once per new_group), and are ignored; the caller's options object keeps
    them, so a second group made with the same object warns again and gets the same config. Where the target
    splits, split_group given that object does the same (a split builds its communicator through another path of
    the backend)."""
    ctx.init_world("eager")
    ranks = list(range(ctx.world_size))
    options = options_part(ctx).make(hints={"bogusHint": "1", "netName": OPTIONS["net_name"]})
    before = options_part(ctx).read(options)
    # a new_group warns once: torchcomms walks a communicator's hints once at its init, warning once per unsupported
    # key (populateNcclConfigFromHints), and the same warning twice for one group is a side effect run twice; a
    # split may init more than one communicator on its way (the simulator's stacks warn for two): at least once
    makers = [("new_group", lambda: dist.new_group(ranks, pg_options=options), True),
              ("a second new_group given the same options object",
               lambda: dist.new_group(ranks, pg_options=options), True)]
    if "split" in ctx.target.capabilities:
        makers.append(("split_group given the same options object",
                       lambda: dist.split_group(split_ranks=[ranks], pg_options=options), False))
    configs = []
    for which, make, once in makers:
        with warned.recorded() as caught:
            group = make()
        named, hidden = warned.matching(caught, lambda m: "bogusHint" in m)
        warned.expect_shown(ctx, hidden, f"{which}: the unknown hint 'bogusHint'")
        ctx.expect(len(named) == 1 if once else len(named) >= 1,
                   f"{which}: warnings naming the unknown hint 'bogusHint'", 1 if once else ">= 1",
                   [str(w.message) for w in caught])
        hints = _config(ctx, group, f"{which} with an unknown hint").get("hints", {})
        ctx.expect("bogusHint" not in hints, f"{which}: unknown hint in the effective config", "ignored", hints)
        ctx.expect_equal(f"{which}: known hint netName next to the unknown one", OPTIONS["net_name"],
                         hints.get("netName"))
        expect_allreduce_members(ctx, group, ranks, f"{which}: group with an unknown hint")
        expect_untouched(ctx, options, before, f"the caller's options object after {which}")
        configs.append((which, hints))
    for which, hints in configs[1:]:
        ctx.expect_equal(f"{which}: its hints (the first group's, same options object)", configs[0][1], hints)
    _near_misses(ctx, ranks)


# a value each known hint would accept: a backend that takes a misspelt key for the known one applies it
_NEAR_MISS_VALUES = {"is_high_priority_stream": "true", "cga_cluster_size": "2", "max_ctas": "5", "min_ctas": "3",
                     "net_name": "Socket"}
_FIELDS = tuple(_NEAR_MISS_VALUES)


def near_miss_hints() -> dict[str, str]:
    """Keys one slip away from a hint torchcomms reads (another case, the last letter dropped or one added, or
    snake_case where it reads only camelCase: net_name), each with a value the hint it misspells would accept: a
    backend that matches names by substring or prefix takes a dropped or added letter for the known key.
    torchcomms compares hint keys exactly and warns on any other ('is not supported in this NCCL version,
    ignoring', comms/torchcomms/nccl/TorchCommNCCLBootstrap.cpp populateNcclConfigFromHints), so each is an unknown
    key."""
    known = {key for keys in HINT_KEYS.values() for key in keys}
    out: dict[str, str] = {}
    for field_name, keys in HINT_KEYS.items():
        spellings = {*keys, field_name}
        for key in sorted(spellings):
            for slip in (key.lower(), key.upper(), key[:1].upper() + key[1:], key[:-1], key + "x"):
                if slip not in known:
                    out.setdefault(slip, _NEAR_MISS_VALUES[field_name])
    return out


def _near_misses(ctx: CheckContext, ranks: list[int]) -> None:
    """A new_group given only misspelt hint keys (``near_miss_hints``) warns naming each and gets the config of a
    group given no hints: a backend that matches hint names loosely applies them (unvalidated, unwarned)."""
    slips = near_miss_hints()
    plain = dist.new_group(ranks, pg_options=options_part(ctx).make())
    control = _config(ctx, plain, "a new_group given no hints (the control)")
    with warned.recorded() as caught:
        group = dist.new_group(ranks, pg_options=options_part(ctx).make(hints=dict(slips)))
        expect_allreduce_members(ctx, group, ranks, "a new_group given misspelt hint keys")
    messages, hidden = warned.matching(caught, lambda m: any(repr(key) in m or f" {key} " in f" {m} " for key in slips))
    warned.expect_shown(ctx, hidden, "a new_group given misspelt hint keys")
    unnamed = [key for key in slips if not any(repr(key) in m or f" {key} " in f" {m} " for m in messages)]
    ctx.expect(not unnamed, f"misspelt hint keys ({len(slips)}, each one slip from a key torchcomms reads) named "
               "by a warning", "every one", f"not named: {unnamed}; warnings: {messages[:4]}")
    config = _config(ctx, group, "a new_group given misspelt hint keys")
    ctx.expect_equal("a new_group given misspelt hint keys: hints in its effective config", {}, config.get("hints", {}))
    changed = {k: config.get(k) for k in _FIELDS if config.get(k) != control.get(k)}
    ctx.expect(not changed, "a new_group given misspelt hint keys: its config's option fields (as a group given no "
               f"hints: {({k: control.get(k) for k in _FIELDS})})", "unchanged", changed)


@check("HINT-DEVICE-SCOPE")
def device_scope(ctx: CheckContext) -> None:
    """Options meant for the accelerator backend do not reach the cpu sibling."""
    world = ctx.init_world("eager", pg_options=options_part(ctx).make(**OPTIONS))
    expect_options(ctx, world, "accelerator backend", OPTIONS)
    cpu_config = config_part(ctx).for_device(world, "cpu")
    if cpu_config is None:
        raise NotObservable(f"target {ctx.target.name} cannot report the cpu backend's options")
    leaked = {k: v for k, v in (cpu_config or {}).items() if k in OPTIONS and v == OPTIONS[k]}
    ctx.expect(not leaked, "NCCL options on the cpu backend", "none", leaked)


@check("HINT-SPLIT-TREES")
def split_trees_options(ctx: CheckContext) -> None:
    """Options given at each level of generated split trees reach the children; a split given none gets its
    parent's, at any depth."""
    check_option_trees(ctx)
