"""Checks for backend qualification: device-qualified strings, subgroup filters, registration."""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

from conformance.checks.common import expect_allreduce_members, expect_raises, require_fields
from conformance.checks.registry import CheckContext, check
from conformance.outcomes import CheckFailed, NotObservable

BUILTIN_DEFAULTS = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl", "mps": "gloo"}


def _backend_name(ctx: CheckContext) -> str:
    """The target's own backend name (the device part of its default backend string)."""
    return ctx.target.default_backend.split(",")[-1].split(":")[-1]


class _RecordingGroup(dist.ProcessGroup):
    """A minimal out-of-tree group that remembers what its creator was given."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._name = ""

    def getBackendName(self) -> str:
        return "cfmrec"

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def shutdown(self) -> None:
        pass


def _recording_creator(seen: list[tuple[Any, Any]]) -> Any:
    def create(common: Any, pg_options: Any) -> _RecordingGroup:
        seen.append((common, pg_options))
        return _RecordingGroup(common.group_rank, common.group_size)

    return create


@check("QUAL-DEVICE-ROUTING")
def device_routing(ctx: CheckContext) -> None:
    """One backend per device type of a qualified string; ops run on their device's backend."""
    name = _backend_name(ctx)
    accelerator = ctx.device.type if ctx.device.type != "cpu" else "cuda"
    world = ctx.init_world(backend=f"cpu:gloo,{accelerator}:{name if ctx.device.type != 'cpu' else 'gloo'}")
    types = {d.type for d in world._device_types}
    ctx.expect({"cpu"} <= types and len(types) >= 2, "device types of the world", ">= {cpu, accelerator}", types)
    backends = {t: world._get_backend(torch.device(t)) for t in types}
    ctx.expect(len({id(b) for b in backends.values()}) == len(backends), "one backend object per device type",
               "distinct", {t: type(b).__name__ for t, b in backends.items()})
    if "launch" not in ctx.probe.observes:
        raise NotObservable(f"target {ctx.target.name} cannot observe launches")
    since = ctx.probe.mark()
    t = torch.ones(2, device=ctx.device)
    dist.all_reduce(t)
    launches = ctx.probe.events("launch", since)
    ctx.expect(bool(launches), f"launches seen for an all_reduce of a {ctx.device.type} tensor", ">= 1", 0)
    require_fields(ctx, launches, "device")
    ctx.expect_equal("device of the launch for a tensor on that device", ctx.device.type, launches[-1]["device"])


@check("QUAL-BARE-EXPANSION")
def bare_expansion(ctx: CheckContext) -> None:
    """A bare name expands to exactly the backend's declared devices."""
    name = _backend_name(ctx)
    declared = set(dist.Backend.backend_capability.get(name, []))
    expanded = BackendConfig(dist.Backend(name)).get_device_backend_map()
    ctx.expect_equal(f"devices of bare backend {name!r}", declared, set(expanded))
    ctx.expect_equal(f"device capability of {name!r} vs the devices the target serves",
                     set(ctx.target.device_types), declared)
    ctx.expect(all(v == name for v in expanded.values()), f"backend for each device of {name!r}", name, expanded)
    world = ctx.init_world("lazy" if "device_binding" not in ctx.target.capabilities else "eager", backend=name)
    expect_allreduce_members(ctx, world, list(range(ctx.world_size)), f"world initialised with bare {name!r}")


@check("QUAL-MALFORMED-REFUSED")
def malformed_refused(ctx: CheckContext) -> None:
    """Malformed strings are refused at init; a correct init afterwards works."""
    name = _backend_name(ctx)
    for bad in (f"cpu:{name},cpu:{name}", f"cpu:{name},", "cpu:", "bogusbackend", f"cpu:{name}:x"):
        expect_raises(ctx, f"init_process_group({bad!r})", lambda b=bad: ctx.init_world("lazy", backend=b),
                      contains=((bad, bad.rstrip(","), bad.split(",")[0], "backend"),))
        ctx.expect(not dist.is_initialized(), f"world initialised after refusing {bad!r}", False, True)
    world = ctx.init_world("lazy")
    expect_allreduce_members(ctx, world, list(range(ctx.world_size)), "correct init after the refused ones")


@check("QUAL-MALFORMED-VALUEERROR")
def malformed_valueerror(ctx: CheckContext) -> None:
    """Malformed strings are refused with ValueError naming the token."""
    name = _backend_name(ctx)
    for bad, token in ((f"cpu:{name},cpu:{name}", "cpu"), (f"cpu:{name},", f"cpu:{name},"), ("cpu:", "cpu:"),
                       ("bogusbackend", "bogusbackend"), (f":{name}", f":{name}")):
        expect_raises(ctx, f"init_process_group({bad!r})", lambda b=bad: ctx.init_world("lazy", backend=b),
                      (ValueError,), (token,))


@check("QUAL-SUBGROUP-FILTER")
def subgroup_filter(ctx: CheckContext) -> None:
    """split_group backend filters naming absent devices or other backends are refused naming the device."""
    name = _backend_name(ctx)
    ctx.init_world("eager")
    ranks = [list(range(ctx.world_size))]
    absent = "xpu" if ctx.device.type != "xpu" else "mps"
    expect_raises(ctx, f"split_group(backend='{absent}:{name}') on a parent without {absent}",
                  lambda: dist.split_group(split_ranks=ranks, backend=f"{absent}:{name}"), (ValueError,),
                  (f"'{absent}'",))
    other = "gloo" if name != "gloo" else "nccl"
    expect_raises(ctx, f"split_group(backend='{ctx.device.type}:{other}') on a {name} parent",
                  lambda: dist.split_group(split_ranks=ranks, backend=f"{ctx.device.type}:{other}"), (ValueError,),
                  (f"'{ctx.device.type}'",))
    child = dist.split_group(split_ranks=ranks, backend=f"{ctx.device.type}:{name}")
    expect_allreduce_members(ctx, child, list(range(ctx.world_size)), "child with a matching filter")


@check("QUAL-OOT-REGISTRATION")
def oot_registration(ctx: CheckContext) -> None:
    """Registration lists the name, makes it available, records its capability, claims only free devices."""
    own = _backend_name(ctx)
    before = dict(dist.Backend.default_device_backend_map)
    for device, builtin in BUILTIN_DEFAULTS.items():
        if own != builtin:
            ctx.expect_equal(f"default backend of {device} with {own!r} registered", builtin, before.get(device))
    dist.Backend.register_backend("cfmtoy", _recording_creator([]), extended_api=True, devices=["cpu", "hpu"])
    ctx.expect("cfmtoy" in dist.Backend.backend_list, "backend_list after registering cfmtoy", "contains cfmtoy",
               dist.Backend.backend_list)
    ctx.expect(dist.is_backend_available("cfmtoy"), "is_backend_available('cfmtoy')", True, False)
    ctx.expect_equal("capability of cfmtoy", ["cpu", "hpu"], list(dist.Backend.backend_capability["cfmtoy"]))
    after = dist.Backend.default_device_backend_map
    ctx.expect_equal("default backend of hpu (unclaimed before)", "cfmtoy", after.get("hpu"))
    changed = {d: (before[d], after.get(d)) for d in before if after.get(d) != before[d]}
    ctx.expect(not changed, "devices already claimed", "unchanged", changed)


@check("QUAL-OOT-CREATOR-ARGS")
def oot_creator_args(ctx: CheckContext) -> None:
    """The creator receives store, ranks, size, timeout, group id, global ranks and pg_options untouched.

    What the creator receives is torch's front end's doing, whatever the world's backend: the world is an
    unbound gloo one, where torch splits nothing for another backend's group on any stack (a bound world on
    torch 2.13 makes non-members no-colour split the world's communicator, v2.13.0 distributed_c10d.py:2057)."""
    world = ctx.init_world("lazy", backend="cpu:gloo")
    seen: list[tuple[Any, Any]] = []
    dist.Backend.register_backend("cfmrec", _recording_creator(seen), extended_api=True, devices=["cpu"])
    options = object()
    members = list(range(ctx.world_size))[::-1][: max(1, ctx.world_size // 2)]
    timeout = timedelta(seconds=123)
    group = dist.new_group(members, backend="cfmrec", pg_options=options, timeout=timeout)
    dist.barrier(group=world)
    if ctx.rank not in members:
        ctx.expect_equal("creator calls on a non-member", 0, len(seen))
        return
    ctx.expect_equal("creator calls on a member", 1, len(seen))
    common, got = seen[0]
    ctx.expect(got is options, "pg_options given to the creator", "the caller's object", got)
    ctx.expect_equal("group_rank", sorted(members).index(ctx.rank), common.group_rank)
    ctx.expect_equal("group_size", len(members), common.group_size)
    ctx.expect_equal("global_ranks_in_group", sorted(members), list(common.global_ranks_in_group))
    ctx.expect_equal("group_id", group.group_name, common.group_id)
    ctx.expect_equal("timeout", timeout, common.timeout)
    common.store.set(f"probe{ctx.rank}", b"ok")
    ctx.expect_equal("store round trip", b"ok", common.store.get(f"probe{ctx.rank}"))


@check("QUAL-OOT-REREGISTER")
def oot_reregister(ctx: CheckContext) -> None:
    """Registering a name twice (or gloo) does not raise, and keeps the first registration or warns."""
    first, second = _recording_creator([]), _recording_creator([])
    dist.Backend.register_backend("cfmdup", first, extended_api=True, devices=["cpu"])
    builtin = dist.Backend._plugins.get("GLOO")
    for name, before in (("cfmdup", first), ("gloo", builtin.creator_fn if builtin else None)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                dist.Backend.register_backend(name, second, extended_api=True, devices=["cpu"])
            except Exception as exc:  # noqa: BLE001 - any exception here crashes the importing module
                raise CheckFailed(f"rank {ctx.rank}: re-registering {name!r}: expected no exception, observed "
                                  f"{type(exc).__name__}: {exc}") from None
        plugin = dist.Backend._plugins.get(name.upper())
        kept = plugin is not None and plugin.creator_fn is before
        warned = [str(w.message) for w in caught if name in str(w.message)]
        ctx.expect(kept or bool(warned), f"re-registering {name!r}",
                   "the first registration kept, or a warning naming it", "silent replacement")


@check("QUAL-OOT-DEVICES-STRING")
def oot_devices_string(ctx: CheckContext) -> None:
    """devices='cpu' is one device or refused, never 'c','p','u' (in the capability or the device map)."""
    before = dict(dist.Backend.default_device_backend_map)
    try:
        dist.Backend.register_backend("cfmstr", _recording_creator([]), extended_api=True, devices="cpu")
    except (ValueError, TypeError) as exc:
        ctx.note(f"devices='cpu' refused: {exc}")
        return
    ctx.expect_equal("capability recorded for devices='cpu'", ["cpu"], list(dist.Backend.backend_capability["cfmstr"]))
    gained = {d: b for d, b in dist.Backend.default_device_backend_map.items() if before.get(d) != b}
    ctx.expect(set(gained) <= {"cpu"}, "devices added to default_device_backend_map by devices='cpu'",
               "none besides cpu", gained)
