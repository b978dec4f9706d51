"""Planted defects by name, and the one place a backend's parts are chosen: ``resolve``.

``DEFECTS`` maps each name to its description and the flawed override(s) in ``simulator/flaws.py`` that
plant it, one per part. A simulator backend resolves its stack and defects once, when it is registered
(``simulator.register(defects=...)``, plus ``SIM_DEFECTS=name1,name2`` from the environment at that
moment): an unknown name is refused then, and the backend's classes are composed then, so no code path
asks which defects are on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from simulator import flaws
from simulator.backend import SimProcessGroup, SimSettings
from simulator.parts import REFERENCE, Parts
from simulator.stacks import STACKS


@dataclass(frozen=True)
class Defect:
    """One planted defect: its flawed override of each part it changes (the part's field name in ``Parts``,
    or ``group`` for the process group). Its description is its first override's docstring."""

    group: type | None = None
    creator: type | None = None
    fabric: type | None = None
    p2p: type | None = None
    work: type | None = None
    p2p_work: type | None = None
    kernel: type | None = None

    @property
    def overrides(self) -> dict[str, type]:
        """Part name -> the flawed class composed over it."""
        return {f.name: cls for f in fields(self) if (cls := getattr(self, f.name)) is not None}

    @property
    def description(self) -> str:
        """What the defect breaks, in one line."""
        return " ".join((next(iter(self.overrides.values())).__doc__ or "").split())


DEFECTS: dict[str, Defect] = {
    "batch_wait_no_wait": Defect(p2p_work=flaws.BatchWaitNoWait),
    "coalesced_async_no_works": Defect(group=flaws.CoalescedAsyncNoWorks),
    "coalesced_per_op_launch": Defect(group=flaws.CoalescedPerOpLaunch),
    "coalesced_drops_tail": Defect(group=flaws.CoalescedDropsTail),
    "split_drops_options": Defect(group=flaws.SplitDropsOptions, creator=flaws.SubgroupDropsOptions),
    "torchcomms_drops_options": Defect(group=flaws.TorchcommsDropsOptions),
    "options_aliased": Defect(group=flaws.OptionsAliased),
    "hint_net_name_snake": Defect(group=flaws.HintNetNameSnake),
    "split_unbound_allowed": Defect(group=flaws.SplitUnboundAllowed),
    "split_child_unbound": Defect(group=flaws.SplitChildUnbound),
    "split_nonmember_raises": Defect(group=flaws.SplitNonmemberRaises),
    "p2p_pair_comm_eager": Defect(group=flaws.P2PPairCommEager),
    "p2p_comm_per_op": Defect(group=flaws.P2PCommPerOp),
    "p2p_warn_missing": Defect(group=flaws.P2PWarnMissing),
    "p2p_warn_repeated": Defect(group=flaws.P2PWarnRepeated),
    "register_corrupts_maps": Defect(creator=flaws.RegisterCorruptsMaps),
    "split_fresh_bootstrap": Defect(group=flaws.SplitFreshBootstrap),
    "invalid_options_accepted": Defect(group=flaws.InvalidOptionsAccepted),
    "unknown_hint_silent": Defect(group=flaws.UnknownHintSilent),
    "split_out_of_range_hang": Defect(group=flaws.SplitOutOfRangeHang),
    "init_drops_options": Defect(creator=flaws.InitDropsOptions),
    "comm_id_by_members": Defect(group=flaws.CommIdByMembers),
    "p2p_anysource_wrong_rank": Defect(group=flaws.P2PAnysourceWrongRank),
    "p2p_mismatch_silent": Defect(group=flaws.P2PMismatchSilent),
    "register_devices_none": Defect(creator=flaws.RegisterDevicesNone),
    # Bugs every stack of the backend shares (a check comparing the backend with itself cannot see them).
    "avg_as_sum": Defect(kernel=flaws.AvgAsSum),
    "minmax_swapped": Defect(kernel=flaws.MinmaxSwapped),
    "int_sum_via_float32": Defect(kernel=flaws.IntSumViaFloat32),
    "reduce_scatter_wrong_shard": Defect(fabric=flaws.ReduceScatterWrongShard),
    "broadcast_root_zero": Defect(group=flaws.BroadcastRootZero),
    "broadcast_records_autograd": Defect(group=flaws.BroadcastRecordsAutograd),
    "barrier_no_wait": Defect(group=flaws.BarrierNoWait),
    "alltoall_even_offsets": Defect(fabric=flaws.AlltoallEvenOffsets),
    "coalesced_block_cap": Defect(group=flaws.CoalescedBlockCap),
    "p2p_recv_ignores_source": Defect(p2p=flaws.P2PRecvIgnoresSource),
    "p2p_pair_comm_unlogged": Defect(group=flaws.P2PPairCommUnlogged),
    "split_refusal_anonymous": Defect(group=flaws.SplitRefusalAnonymous),
    "newgroup_options_aliased": Defect(group=flaws.NewgroupOptionsAliased),
    "p2p_peer_unchecked": Defect(group=flaws.P2PPeerUnchecked),
    "split_ranks_as_global": Defect(group=flaws.SplitRanksAsGlobal),
    "p2p_warn_once_per_process": Defect(group=flaws.P2PWarnOncePerProcess),
    "lazy_comm_default_config": Defect(group=flaws.LazyCommDefaultConfig),
    "collective_calls_by_name": Defect(fabric=flaws.CollectiveCallsByName),
    "allgather_short_list_accepted": Defect(fabric=flaws.AllgatherShortListAccepted),
    "allreduce_timeout_swallowed": Defect(fabric=flaws.AllreduceTimeoutSwallowed),
    "hint_warning_hidden": Defect(group=flaws.HintWarningHidden),
    "allreduce_draws_rng": Defect(group=flaws.AllreduceDrawsRng),
    "complex_product_partwise": Defect(kernel=flaws.ComplexProductPartwise),
    "work_future_released_at_wait": Defect(work=flaws.WorkFutureReleasedAtWait),
}
# Mixed reduce ops in one _coalescing_manager block are not plantable here: torch 2.13's front end
# passes only the first op's reduce op to the backend, so no backend ever sees the mix.

ENV = "SIM_DEFECTS"


def planted(names: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """``names`` plus those listed in ``environ[SIM_DEFECTS]`` (comma-separated; default os.environ); an unknown
    name is a ValueError."""
    listed = (environ if environ is not None else os.environ).get(ENV, "")
    chosen = frozenset(names) | {n.strip() for n in listed.split(",") if n.strip()}
    unknown = chosen - DEFECTS.keys()
    if unknown:
        raise ValueError(f"unknown simulator defect(s) {sorted(unknown)}; known: {sorted(DEFECTS)}")
    return chosen


def _recorder(part: str, consulted: set[str]) -> type:
    """A class whose methods, for every method some defect overrides on ``part``, add those defects' names to
    ``consulted`` and run the part's own: what a run could have been changed by."""
    by_method: dict[str, set[str]] = {}
    for name, defect in DEFECTS.items():
        cls = defect.overrides.get(part)
        for method in (m for m, v in vars(cls or object).items() if callable(v) and not m.startswith("__")):
            by_method.setdefault(method, set()).add(name)

    def recording(method: str, names: frozenset[str]) -> Any:
        def record(self: Any, *args: Any, **kwargs: Any) -> Any:
            consulted.update(names)
            return getattr(super(recorder, self), method)(*args, **kwargs)

        return record

    recorder = type(f"Recording_{part}", (), {m: recording(m, frozenset(n)) for m, n in by_method.items()})
    return recorder


def _compose(part: str, base: type, names: frozenset[str], consulted: set[str] | None) -> type:
    flawed = [cls for n in sorted(names) if (cls := DEFECTS[n].overrides.get(part))]
    recording = [_recorder(part, consulted)] if consulted is not None else []
    if not flawed and not recording:
        return base
    return type(base.__name__, (*recording, *flawed, base), {})


def resolve(stack: str = "nccl-legacy", names: Iterable[str] = (), consulted: set[str] | None = None,
            environ: Mapping[str, str] | None = None) -> SimSettings:
    """The settings of a backend modelling ``stack`` with the defects ``names`` (and SIM_DEFECTS): its classes composed
    once. With ``consulted``, the backend adds to it the name of every defect whose overridden method it runs
    (the defect matrix runs a defect only against the checks whose clean run could have met it)."""
    if stack not in STACKS:
        raise ValueError(f"simulator: stack must be one of {', '.join(STACKS)}, got {stack!r}")
    chosen = planted(names, environ)
    classes: dict[str, Any] = {}
    for f in fields(Parts):
        base = getattr(REFERENCE, f.name)
        is_instance = not isinstance(base, type)
        cls = _compose(f.name, type(base) if is_instance else base, chosen, consulted)
        classes[f.name] = cls() if is_instance else cls
    group: type[SimProcessGroup] = _compose("group", STACKS[stack], chosen, consulted)
    return SimSettings(stack=stack, defects=chosen, group=group, parts=Parts(**classes))
