"""Running generated group programs (``group_programs``) on every rank and judging each step against the model.

After every step each rank judges what it can see of its own groups:

- values: every all_reduce and message exact (each rank computes them from the program, step and sender);
- communicators its probe recorded during the step: a new_group or split of a bound world makes exactly one for
  this rank's group (a split's parent is the parent group's), a lazy group one at its first collective and none
  before, a message on a bound group none, on a lazy group only 2-rank communicators of the rank and a member
  it talks to (the talking pair's first message on the group makes one on both, where the target declares
  ``lazy_pair_comms`` and the group has no communicator of its own yet; a later one none), each with the group's
  config; a batch_isend_irecv step on a group without a communicator of its own runs the group's all_reduce first
  (torch allows a batch as a group's first op only with every member in it); destroy_process_group(group)
  destroys the group's communicators and none of a live group;
- the options a group must hold (``group_programs.expected_sets``), in its effective config and in every
  communicator made for it;
- the caller's options objects, unchanged by every group made with them.

Every rank runs every step, so a wrong value or a wrong communicator is reported without desynchronising the
ranks; a backend error ends the check there. A failure names the seed, the program and its steps up to the
first failing one (a program's later steps cannot cause it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.common import effective_config, new_comms, options_part
from conformance.checks.generated import agree
from conformance.checks.group_programs import (
    DEFAULTS,
    UNJUDGED,
    WORLD_LAYER,
    GroupProgram,
    GroupStep,
    expected_sets,
    programs,
)
from conformance.checks.hints import expect_untouched
from conformance.checks.option_trees import OPTION_SETS, set_mismatch
from conformance.checks.reference import mismatch
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed, NotObservable
from conformance.probe import control_missing, observing
from conformance.torch_compat import PAIR_P2P_STACKS, members_only_new_group_refused, split_refuses_unbound

ELEMENTS = 3


@dataclass
class _Mine:
    """This rank's group of one layer: the handle, its members in group-rank order, its index in the layer,
    whether it has a communicator of its own, its communicators' ids and the pairs (of this rank and a member)
    it has made a 2-rank communicator for."""

    handle: Any
    members: list[int]
    index: int
    has_comm: bool
    comms: set[str] = field(default_factory=set)
    pairs: set[tuple[int, ...]] = field(default_factory=set)


def value(program: int, step: int, sender: int) -> torch.Tensor:
    """What ``sender`` contributes at (program, step): int64 elements distinct per program, step and sender."""
    base = ((program * 64 + step) * 256 + sender) * 8
    return torch.arange(base, base + ELEMENTS, dtype=torch.int64)


class _Run:
    """One program on this rank: the layers it belongs to and what it has seen wrong."""

    def __init__(self, ctx: CheckContext, number: int, program: GroupProgram) -> None:
        self.ctx, self.number, self.program = ctx, number, program
        self.sets: list[list[int]] = []
        self.layers: list[_Mine | None] = []
        self.problems: list[str] = []
        self.defaults: dict[str, Any] = {}
        self.pairs_declared = "lazy_pair_comms" in ctx.target.capabilities
        # a stack whose bound groups send on 2-rank communicators by design (nccl-lazy)
        self.pairs_by_design = ctx.target.target.stack in PAIR_P2P_STACKS
        self.bound = program.bound  # what torch made of the world: some stacks bind every world (nccl2)
        # layers whose caller changed its options object after making them (``_untouched``), and the splits given
        # none of those or of these, whose options are not judged
        self.changed: set[int] = set()
        self.unjudged: set[int] = set()
        self.destroys_seen = observing("comm_destroyed") in ctx.target.capabilities

    # -- the model's options ------------------------------------------------------------------------------
    def _want(self, index: int) -> dict[str, Any]:
        return self.defaults if index == DEFAULTS else OPTION_SETS[index]

    def _name(self, index: int) -> str:
        return "the backend's defaults" if index == DEFAULTS else f"options set {index}"

    def _fail(self, step: GroupStep | str, text: str) -> None:
        """A problem seen at ``step`` (or at the named moment)."""
        where = step if isinstance(step, str) else f"step {step.describe()}"
        self.problems.append(f"rank {self.ctx.rank}: {where}: {text}")

    def _judge_config(self, step: GroupStep | str, what: str, config: Any, index: int) -> None:
        """``config`` (a dict, or None where none is shown) holds every field of the set ``index`` names."""
        if index == UNJUDGED:
            return
        if not isinstance(config, dict):
            self._fail(step, f"{what}: expected a config holding {self._name(index)}, observed {config!r}")
            return
        want = self._want(index)
        seen = set_mismatch(config, want)
        if seen is not None:
            self._fail(step, f"{what}: expected {self._name(index)} {dict(want)}, observed {seen}")

    def _judge_group_config(self, step: GroupStep | str, layer: int) -> None:
        mine = self.layers[layer]
        if mine is not None and layer not in self.unjudged:
            what = f"effective config of its group {mine.members} (layer {layer})"
            config = effective_config(self.ctx, mine.handle, what)
            self._judge_config(step, what, config,
                               self.sets[layer][mine.index])

    # -- starting ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """The world (a bound one makes its communicator at once); then the defaults, read from a group of every
        rank given a default options object, which must make one communicator by its first collective."""
        ctx = self.ctx
        given = self.program.world_options
        since = ctx.probe.mark()
        ctx.init_world("eager" if self.program.bound else "lazy",
                       pg_options=None if given is None else options_part(ctx).make(**OPTION_SETS[given]))
        everyone = list(range(ctx.world_size))
        start = "at the program's start"
        self.bound = dist.group.WORLD.bound_device_id is not None
        if self.program.bound and not self.bound:
            self._fail(start, "the world's bound_device_id after an eager init: expected a device, observed None")
        world = _Mine(dist.group.WORLD, everyone, 0, self.bound)
        self.layers.append(world)
        made = new_comms(ctx, since)
        if self.bound:
            own = [e for e in made if e.get("mode") != "p2p"]
            if len(own) != 1 or sorted(own[0].get("members") or ()) != everyone:
                self._fail(start, f"communicators a bound world's init made: expected one of {everyone}, observed "
                           f"{_shown(made)}")
            world.comms = {e["comm"] for e in own}
        elif made:
            self._fail(start, f"communicators a lazy world's init made: expected none, observed {_shown(made)}")
        since = ctx.probe.mark()
        plain = ctx.new_group(everyone, pg_options=options_part(ctx).make())
        self._all_reduce(-1, plain, everyone, f"a group given a default options object, {start}")
        own = [e for e in new_comms(ctx, since) if e.get("mode") != "p2p"]
        if control_missing(ctx.probe, "comm_created") is not None:
            raise NotObservable(f"target {ctx.target.name}'s probe recorded no communicator, not even for a new "
                                "world and a group's first collective: it cannot show which communicators a step makes")
        if len(own) != 1:
            self._fail(start, f"communicators a new_group of every rank made by its first collective: expected 1, "
                       f"observed {_shown(own)}")
        since = ctx.probe.mark()
        self._all_reduce(-1, plain, everyone, f"a group given a default options object, again, {start}")
        again = [e for e in new_comms(ctx, since) if e.get("mode") != "p2p"]
        if again:  # the first collective made the group's communicator (just judged): the second keeps it
            self._fail(start, f"communicators the second collective of that group made: expected none (its first "
                       f"made one), observed {_shown(again)}")
        config = effective_config(ctx, plain, "the effective config of a group of every rank after its first op")
        if not isinstance(config, dict):
            raise NotObservable(f"target {ctx.target.name} shows no effective config for a group after its first "
                                "collective")
        self.defaults = {k: config.get(k) for k in OPTION_SETS[0]}
        self.sets = expected_sets(self.program, self._inherits)
        if self.bound:
            self._judge_group_config(start, WORLD_LAYER)

    def _inherits(self, step: GroupStep) -> bool | None:
        """Whether a new step given no options inherits the world's: where this world's subgroups are made with
        one split_group (``new_partition``); None where torch makes every new_group through split_group and
        hands it no options (torch 2.13's torchcomms routing: v2.13.0 distributed_c10d.py:5656-5660, :5836-5862):
        what it gets is torch's doing, not judged (HINT-NEWGROUP-OPTIONS notes the same)."""
        if members_only_new_group_refused(self.ctx.target.target.stack):
            return None
        return self.ctx.subgroups_by_split() and len(step.parts[0]) > 1

    # -- steps -------------------------------------------------------------------------------------------
    def step(self, step: GroupStep) -> None:
        """Run ``step`` on this rank and judge what it can see of it."""
        since = self.ctx.probe.mark()
        if step.kind == "new":
            self._new(step, since)
        elif step.kind == "split":
            self._split(step, since)
        elif step.kind == "use":
            self._use(step, since)
        else:
            self._destroy(step, since)

    def _options(self, step: GroupStep) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        """The kwargs giving the step's options, the options object and what it held before."""
        if step.options is None:
            return {}, None, {}
        made = options_part(self.ctx).make(**OPTION_SETS[step.options])
        return {"pg_options": made}, made, options_part(self.ctx).read(made)

    def _made(self, step: GroupStep | str, since: int, layer: int, parent: set[str] | None,
              skip: set[str] | None = None) -> None:
        """Judge the communicators a new group of ``layer`` made on this rank during ``step`` (but those in ``skip``,
        judged already): exactly one (none on a lazy world), of this rank's group, child of ``parent`` where
        given, with the group's options."""
        mine = self.layers[layer]
        assert mine is not None
        created = [e for e in new_comms(self.ctx, since) if e.get("comm") not in (skip or set())]
        if not mine.has_comm:
            if created:
                self._fail(step, f"communicators made for a group of a lazy world before its first collective: "
                           f"expected none, observed {_shown(created)}")
            return
        own = [e for e in created if e.get("mode") != "p2p"]
        if len(own) != 1 or len(created) != 1:
            self._fail(step, f"communicators made on rank {self.ctx.rank} for its group {mine.members}: expected 1, "
                       f"observed {_shown(created)}")
        for event in own:
            self._judge_event(step, event, mine, layer)
            if parent and event.get("parent") is not None and event.get("parent") not in parent:
                self._fail(step, f"parent of communicator {event.get('comm')}: expected one of {sorted(parent)} "
                           f"(the parent group's), observed {event.get('parent')}")
        mine.comms |= {e["comm"] for e in own}
        self._judge_group_config(step, layer)

    def _judge_event(self, step: GroupStep | str, event: dict[str, Any], mine: _Mine, layer: int,
                     members: list[int] | None = None) -> None:
        """A communicator made for ``layer``'s group of this rank: its members (``members`` for a pair's) and
        config."""
        want = sorted(mine.members if members is None else members)
        if sorted(event.get("members") or ()) != want:
            self._fail(step, f"members of communicator {event.get('comm')} ({event.get('mode')}): expected {want}, "
                       f"observed {event.get('members')}")
        if isinstance(event.get("config"), dict) and layer not in self.unjudged:
            self._judge_config(step, f"config of communicator {event.get('comm')} ({event.get('mode')}) made for "
                               f"its group {mine.members}", event["config"], self.sets[layer][mine.index])

    def _new(self, step: GroupStep, since: int) -> None:
        kwargs, made, before = self._options(step)
        parts = [list(p) for p in step.parts[0]]
        handles = self.ctx.new_partition(parts, **kwargs)
        index = next(i for i, p in enumerate(parts) if self.ctx.rank in p)
        handle = handles[index]
        self.layers.append(_Mine(handle, dist.get_process_group_ranks(handle), index, self.bound))
        self._expect_members(step, parts[index])
        self._made(step, since, len(self.layers) - 1, None)
        if made is not None:
            self._untouched(step, made, before, "new_group")

    def _split(self, step: GroupStep, since: int) -> None:
        kwargs, made, before = self._options(step)
        parent = self.layers[step.layer]
        assert parent is not None
        cut = step.parts[parent.index]
        me = parent.members.index(self.ctx.rank)
        child = dist.split_group(parent_pg=parent.handle, split_ranks=[list(p) for p in cut],
                                 timeout=timedelta(seconds=self.ctx.timeout_s), **kwargs)
        part = next(j for j, p in enumerate(cut) if me in p)
        index = sum(len(p) for p in step.parts[:parent.index]) + part
        members = [parent.members[r] for r in cut[part]]
        if child is None or child is dist.GroupMember.NON_GROUP_MEMBER:
            raise CheckFailed(f"rank {self.ctx.rank}: step {step.describe()}: expected a group of {sorted(members)}, "
                              f"observed {child!r}")
        self.layers.append(_Mine(child, dist.get_process_group_ranks(child), index, self.bound))
        self._expect_members(step, members)
        if step.options is None and step.layer in self.changed | self.unjudged:
            self.unjudged.add(len(self.layers) - 1)
        theirs = self._lazy_split(step, since, parent) if not self.bound else set()
        self._made(step, since, len(self.layers) - 1, parent.comms, skip=theirs)
        if made is not None:
            self._untouched(step, made, before, "split_group")

    def _lazy_split(self, step: GroupStep, since: int, parent: _Mine) -> set[str]:
        """A split of an unbound parent (torch 2.15 allows it; v2.15.0 distributed_c10d.py:6886, the child is left
        unbound, :7003) makes the child's communicator at its first collective, or at once by a split of the
        parent's, whose own it then makes first where it has none (the simulator's ProcessGroupNCCL and toyccl do
        that): both are accepted, and the parent's judged as the parent's first collective would be. Returns the
        ids of the parent's communicators made now."""
        created = [e for e in new_comms(self.ctx, since) if e.get("mode") != "p2p"]
        if not created:
            return set()
        self.layers[-1].has_comm = True  # type: ignore[union-attr]
        theirs = [e for e in created if sorted(e.get("members") or ()) == sorted(parent.members)
                  and e.get("mode") != "split"]
        if parent.has_comm or not theirs:
            return set()
        parent.has_comm = True
        parent.comms |= {e["comm"] for e in theirs}
        layer = self.layers.index(parent)
        for event in theirs:
            self._judge_event(step, event, parent, layer)
        return {e["comm"] for e in theirs}

    def _expect_members(self, step: GroupStep, members: list[int]) -> None:
        """The new group has ``members``; in a bound world it is bound to the world's device too (torch reads a
        group's bound_device_id, e.g. for barrier's device; SPLIT-BOUND-INHERIT)."""
        mine = self.layers[-1]
        assert mine is not None
        if sorted(mine.members) != sorted(members):
            self._fail(step, f"members of its new group: expected {sorted(members)}, observed {mine.members}")
        bound = dist.group.WORLD.bound_device_id
        if self.bound and getattr(mine.handle, "bound_device_id", None) != bound:
            self._fail(step, f"bound_device_id of its new group {mine.members} in a bound world: expected {bound}, "
                       f"observed {getattr(mine.handle, 'bound_device_id', None)}")

    def _untouched(self, step: GroupStep, made: Any, before: dict[str, Any], call: str) -> None:
        """The caller's options object is as it was. On a lazy world the caller then changes it to another set's
        values (as a caller reusing its object does), which the group, whose communicator is made later, must not
        take. Not on a bound world: there a split given no options copies its parent's options object (torch 2.13:
        v2.13.0 distributed_c10d.py:5656-5660), which ProcessGroupNCCL keeps as the caller's own (options_), so
        what it inherits after such a change is torch's and the backend's aliasing, not judged here."""
        try:
            expect_untouched(self.ctx, made, before, f"the caller's options object after {call}(pg_options=it)")
        except CheckFailed as exc:
            self._fail(step, str(exc))
        if not self.bound:
            assert step.options is not None
            options_part(self.ctx).change(made, **OPTION_SETS[step.options % 3 + 1])
            self.changed.add(len(self.layers) - 1)

    def _use(self, step: GroupStep, since: int) -> None:
        mine = self.layers[step.layer]
        assert mine is not None
        if step.entry == "all_reduce":
            self._collective(step, mine, since)
            return
        if step.entry == "batch_isend_irecv" and not mine.has_comm:
            # torch allows a batch as a group's first op only with every member in it (batch_isend_irecv's
            # docstring, v2.13.0 distributed_c10d.py:3031-3036: ProcessGroupNCCL runs it on the group's
            # communicator, made then): a batch step on a group without one runs the group's all_reduce first
            self._collective(step, mine, since)
            since = self.ctx.probe.mark()
        self._talk(step, mine, since)
        # every rank waits for this step's messages to be received, through the check's store (not the backend): a
        # rank free to run ahead could send a later step's message to this one's any-source receive, which may take it
        agree(self.ctx, list(range(self.ctx.world_size)), f"group-program/{self.number}/step", str(step.index))

    def _collective(self, step: GroupStep, mine: _Mine, since: int) -> None:
        """The group's all_reduce at ``step``: exact data, and a communicator made by it only where the group had
        none (then one of its members)."""
        self._all_reduce(step.index, mine.handle, mine.members,
                         f"its group {mine.members} (layer {step.layer}) at step {step.describe()}")
        created = new_comms(self.ctx, since)
        if mine.has_comm:
            if created:
                self._fail(step, f"communicators made by a collective on a group that has one: expected none, "
                           f"observed {_shown(created)}")
            return
        mine.has_comm = True
        self._made(step, since, step.layer, None)

    def _all_reduce(self, index: int, group: Any, members: list[int], what: str) -> None:
        """An all_reduce (SUM) of step ``index``'s values over ``group``, judged exact."""
        total = value(self.number, index, self.ctx.rank).to(self.ctx.device)
        dist.all_reduce(total, group=group)
        want = [sum(c) for c in zip(*(value(self.number, index, m).tolist() for m in members))]
        bad = mismatch(total, want, torch.int64)
        if bad is not None:
            self.problems.append(f"rank {self.ctx.rank}: all_reduce (SUM) over {what}: expected {want}, observed {bad}")

    def _talk(self, step: GroupStep, mine: _Mine, since: int) -> None:
        """One message from the member at ``talk[0]`` to the one ``talk[1]`` on, by the step's entry point."""
        n = len(mine.members)
        if n < 2:
            return
        first = step.talk[0] % n
        sender, receiver = mine.members[first], mine.members[(first + 1 + step.talk[1] % (n - 1)) % n]
        rank = self.ctx.rank
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the lazy-P2P warning: P2P-LAZY-WARN-ONCE's subject
            if rank == sender:
                _send(step.entry, value(self.number, step.index, rank).to(self.ctx.device), receiver, mine.handle)
            elif rank == receiver:
                got = torch.full((ELEMENTS,), -1, dtype=torch.int64, device=self.ctx.device)
                source = _receive(step.entry, got, sender, mine.handle)
                want = value(self.number, step.index, sender).tolist()
                bad = mismatch(got, want, torch.int64)
                if bad is not None:
                    self._fail(step, f"message from global rank {sender} on its group {mine.members}: expected "
                               f"{want}, observed {bad}")
                if source is not None and source != sender:
                    self._fail(step, f"the source recv(src=None) returned on its group {mine.members}: expected "
                               f"global rank {sender}, observed {source}")
        self._judge_pairs(step, mine, since, sender, receiver)

    def _judge_pairs(self, step: GroupStep, mine: _Mine, since: int, sender: int, receiver: int) -> None:
        """The communicators the message made on this rank (see the module's docstring)."""
        created = new_comms(self.ctx, since)
        rank = self.ctx.rank
        pair = (min(sender, receiver), max(sender, receiver))
        pairs_used = not self.bound or self.pairs_by_design
        if not pairs_used or rank not in pair:
            if created:
                why = "a bound group's own serves it" if not pairs_used else f"rank {rank} takes no part in it"
                self._fail(step, f"communicators made on rank {rank} by a message on its group {mine.members}: "
                           f"expected none ({why}), observed {_shown(created)}")
            return
        any_source = rank == receiver and step.entry == "recv(src=None)"
        allowed = {tuple(sorted((rank, m))) for m in mine.members if m != rank} if any_source else {pair}
        for event in created:
            members = tuple(sorted(event.get("members") or ()))
            if event.get("mode") != "p2p" or members not in allowed:
                self._fail(step, f"communicator {event.get('comm')} ({event.get('mode')}, members "
                           f"{event.get('members')}) made by a message between {list(pair)} on its group "
                           f"{mine.members}: expected only 2-rank communicators of one of {sorted(allowed)}")
            elif members in mine.pairs:
                self._fail(step, f"a second 2-rank communicator {event.get('comm')} for {list(members)} on its group "
                           f"{mine.members}: expected the first one reused")
            else:
                self._judge_event(step, event, mine, step.layer, list(members))
        made = [e for e in created if tuple(sorted(e.get("members") or ())) == pair]
        must = (self.pairs_declared and not mine.has_comm) or (self.bound and self.pairs_by_design)
        if pair not in mine.pairs and must and len(made) != 1:
            why = "by design of the stack" if self.bound else "on a target declaring lazy_pair_comms"
            self._fail(step, f"2-rank communicators made for {list(pair)}'s first message on its group "
                       f"{mine.members}, {why}: expected 1, observed {_shown(made)}")
        mine.pairs |= {tuple(sorted(e.get("members") or ())) for e in created if e.get("mode") == "p2p"}
        mine.comms |= {e["comm"] for e in created}

    def _destroy(self, step: GroupStep, since: int) -> None:
        mine = self.layers[step.layer]
        assert mine is not None
        dist.destroy_process_group(mine.handle)
        self.layers[step.layer] = None
        made = [e.get("comm") for e in new_comms(self.ctx, since)]
        if made:  # a teardown that reaches a lazy group's communicator through its getter makes it to release it
            self._fail(step, f"communicators made by destroying group {mine.members}: expected none, observed {made}")
        if not self.destroys_seen:
            return
        gone = {e.get("comm") for e in self.ctx.probe.events("comm_destroyed", since)}
        kept = set().union(*(m.comms for m in self.layers if m is not None))
        if mine.comms - gone:
            self._fail(step, f"communicators of its destroyed group {mine.members} still alive: expected "
                       f"{sorted(mine.comms)} destroyed, observed {sorted(gone)} destroyed")
        if gone & kept:
            self._fail(step, f"communicators of live groups destroyed with group {mine.members}: "
                       f"{sorted(gone & kept)}")

    def finish(self) -> None:
        """An all_reduce on every live layer, then the world destroyed; a lazy group's first collective is judged
        as a use step's is (the communicator it makes, its options)."""
        end, when = len(self.program.steps), "at the program's end"
        for layer, mine in enumerate(self.layers):
            if mine is not None:
                since = self.ctx.probe.mark()
                self._all_reduce(end, mine.handle, mine.members, f"its group {mine.members} (layer {layer}) {when}")
                if not mine.has_comm:
                    mine.has_comm = True
                    self._made(when, since, layer, None)
        dist.destroy_process_group()


def _shown(events: list[dict[str, Any]]) -> list[tuple[Any, Any, Any]]:
    return [(e.get("comm"), e.get("mode"), e.get("members")) for e in events]


def _send(entry: str, tensor: torch.Tensor, peer: int, group: Any) -> None:
    if entry == "isend/irecv":
        dist.isend(tensor, peer, group=group).wait()
    elif entry == "batch_isend_irecv":
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer, group=group)]):
            work.wait()
    else:
        dist.send(tensor, peer, group=group)


def _receive(entry: str, tensor: torch.Tensor, peer: int, group: Any) -> int | None:
    """Receive into ``tensor``; the source recv(src=None) returned (None for the other entry points)."""
    if entry == "isend/irecv":
        dist.irecv(tensor, peer, group=group).wait()
    elif entry == "batch_isend_irecv":
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensor, peer, group=group)]):
            work.wait()
    elif entry == "recv(src=None)":
        return dist.recv(tensor, src=None, group=group)
    else:
        dist.recv(tensor, peer, group=group)
    return None


def check_group_programs(ctx: CheckContext) -> None:
    """Run the run's group programs; fail naming the seed, the program and its steps up to the first failing one."""
    caps, gen = ctx.target.capabilities, ctx.generation
    drawn = programs(gen.seed, gen.budget, ctx.world_size, "device_binding" in caps, "split" in caps,
                     "p2p_any_source" in caps, lazy_splits=not split_refuses_unbound())
    everyone = list(range(ctx.world_size))
    for number, program in enumerate(drawn):
        run = _Run(ctx, number, program)
        run.start()
        failed_at = len(program.steps)
        for step in program.steps:
            seen = len(run.problems)
            run.step(step)
            if len(run.problems) > seen:
                failed_at = min(failed_at, step.index)
        run.finish()
        first = min(int(a) for a in agree(ctx, everyone, f"group-program/{number}", str(failed_at)))
        if run.problems or first < len(program.steps):
            where = (f"group program {number} (seed {gen.seed}; reproduce with {gen.reproduce()}): "
                     f"{program.describe(first)}")
            shown = " | ".join(run.problems[:3]) if run.problems else "another rank's judgement failed (its "\
                "error names it)"
            raise CheckFailed(f"{where}: {shown}")
    if ctx.rank == 0:
        ctx.note(f"group programs: {len(drawn)} of {len(drawn[0].steps)} steps (seed {gen.seed}, budget "
                 f"{gen.budget}; worlds {', '.join('bound' if p.bound else 'lazy' for p in drawn)})")
