"""Running generated programs on every rank: issuing their steps, completing async ones in a drawn order,
judging every tensor, agreeing on the outcome through the check's store, and shrinking a failing program.

A failing program is shrunk (``shrink``): all steps made sync, the program cut after its first failing step,
then earlier steps removed one at a time, each candidate run by every rank and judged through the check's
store; the failure names the seed and the shortest failing program found.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from conformance.checks.cases import stable_seed
from conformance.checks.generated import MAX_SHRINK_STEPS, agree
from conformance.checks.program_steps import Issued, complete, issue
from conformance.checks.programs import (
    STEPS,
    Step,
    all_programs,
    coverage,
    dimensions,
    possible_kinds,
    program_groups,
    program_partitions,
)
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

WAIT_SHARE = 0.35  # after each step, the chance (repeated) that this rank completes an outstanding op now
RAISED = "raised"


Failure = tuple[int, str]  # (the step's index in the drawn program, what was wrong)


def run_program(ctx: CheckContext, steps: list[Step], groups: list[list[int]], handles: list[Any],
                wait_seed: int) -> list[Failure]:
    """Run ``steps`` on this rank; the failures it saw, in the order seen. A backend error ends the run: it is
    raised (the members may no longer agree on what comes next)."""
    rng = random.Random(stable_seed(wait_seed, ctx.rank))
    run = ctx.agreements.get("program/run", 0)  # every rank runs programs alike: the same count everywhere
    ctx.agreements["program/run"] = run + 1
    failures: list[Failure] = []
    pending: list[Issued] = []
    done: list[Issued] = []

    def report(issued: Issued, when: str, problems: list[str]) -> None:
        failures.extend((issued.step.index, f"rank {ctx.rank}: {issued.step.describe(groups)}, {when}: {problem}")
                        for problem in problems)

    def settle(issued: Issued, when: str) -> None:
        what = issued.step.describe(groups)
        report(issued, when, issued.seen + complete(ctx, issued, what) + issued.problems(ctx))
        done.append(issued)

    for step in steps:
        members = groups[step.group]
        if ctx.rank in members:
            issued = issue(ctx, step, handles[step.group], members, step.describe(groups), str(run))
            if issued is not None and not step.is_async:
                settle(issued, "when the call returned")
            elif issued is not None:
                pending.append(issued)
        waiting = [p for p in pending if p.step.finish != "poll"]  # polled ones wait for the program's end
        while waiting and rng.random() < WAIT_SHARE:
            issued = waiting.pop(rng.randrange(len(waiting)))
            pending.remove(issued)
            settle(issued, f"once complete (step #{step.index} issued last)")
    rng.shuffle(pending)
    if any(s.is_async and s.finish == "poll" for s in steps):  # alike on every rank
        # every member has issued every step before anyone polls: a polled op then needs no rank's help to
        # complete (through the check's store, not the backend)
        agree(ctx, list(range(ctx.world_size)), "program/issued", str(run))
    for issued in pending:
        settle(issued, "once complete at the program's end")
    if not failures:
        for issued in done:  # a later op must not have written into an earlier one's output
            report(issued, "at the program's end, after the later steps", issued.problems(ctx))
    return failures


@dataclass
class Outcome:
    """How a program went on every rank: the statuses agreed through the store, the position (in the program
    run) of the first step that failed on any rank, and what this rank saw."""

    statuses: list[str]
    first: int
    seen: list[str]

    @property
    def failed(self) -> bool:
        return "mismatch" in self.statuses and RAISED not in self.statuses


def judge_program(ctx: CheckContext, steps: list[Step], groups: list[list[int]], handles: list[Any],
                  wait_seed: int, topic: str) -> Outcome:
    """Run ``steps`` and agree with every rank on the outcome. A backend error (or a refusal that breaks the
    optional-op rule) is RAISED: no further program or candidate runs."""
    try:
        failures = run_program(ctx, steps, groups, handles, wait_seed)
        status = "mismatch" if failures else "ok"
        seen = [message for _, message in failures]
    except Exception as exc:  # noqa: BLE001 - every rank stops on it, as Findings does
        status, failures, seen = RAISED, [], [str(exc) if isinstance(exc, CheckFailed)
                                                else f"rank {ctx.rank}: raised {type(exc).__name__}: {exc}"]
    positions = {s.index: p for p, s in enumerate(steps)}
    mine = min((positions[i] for i, _ in failures), default=len(steps))
    answers = [a.split(":") for a in agree(ctx, list(range(ctx.world_size)), topic, f"{status}:{mine}")]
    return Outcome([a[0] for a in answers], min(int(a[1]) for a in answers), seen)


def shrink(ctx: CheckContext, steps: list[Step], outcome: Outcome, groups: list[list[int]], handles: list[Any],
           wait_seed: int, topic: str) -> tuple[list[Step], list[str]]:
    """The shortest still-failing program found from ``steps`` (which failed: ``outcome``) and what this rank saw
    in it: every step made sync, then the program cut after its first failing step, then each step before that
    one removed in turn (nearest first); every candidate judged by every rank, at most MAX_SHRINK_STEPS of them.
    Stops at a candidate that raised anywhere."""
    best, seen = steps, outcome.seen

    def attempt(candidate: list[Step]) -> Outcome | None:
        result = judge_program(ctx, candidate, groups, handles, wait_seed, topic)
        return result if result.failed else None

    tries = 1
    sync = [replace(s, is_async=False) for s in steps]
    if (synced := attempt(sync)) is not None:
        best, outcome, seen = sync, synced, synced.seen
    cut = best[:outcome.first + 1]
    position = len(cut) - 2  # the step before the first failing one
    if len(cut) < len(best):
        tries += 1
        if (result := attempt(cut)) is not None:
            best, seen = cut, result.seen
    while position >= 0 and tries < MAX_SHRINK_STEPS:
        candidate = best[:position] + best[position + 1:]
        tries += 1
        if (result := attempt(candidate)) is not None:
            best, seen = candidate, result.seen
        position -= 1
    return best, seen


def offered_kinds(ctx: CheckContext, world: Any) -> tuple[str, ...]:
    """The kinds the target runs: each tried once on the world (one float32 element, sync, judged like any
    step); a kind refused naming it (``optional_case``) on any rank is left out of every program."""
    members = list(range(ctx.world_size))
    refused = []
    for number, kind in enumerate(possible_kinds(ctx.world_size)):
        step = Step(index=-1 - number, kind=kind, group=0, dtype=torch.float32, numel=1, op="SUM", root=0, tag=0,
                    is_async=False)
        issued = issue(ctx, step, world, members, f"{kind} on the world (is it offered?)", "offered")
        problems = issued.seen + issued.problems(ctx) if issued else []
        if problems:
            raise CheckFailed(f"rank {ctx.rank}: {kind} of one float32 element on the world: {problems[0]}")
        if issued is None:
            refused.append(kind)
    answers = agree(ctx, members, "program/offered", ",".join(refused))
    left_out = {k for answer in answers for k in answer.split(",") if k}
    return tuple(k for k in possible_kinds(ctx.world_size) if k not in left_out)


def check_programs(ctx: CheckContext) -> None:
    """Run the run's programs on the world and every group of ``program_partitions``; fail naming the seed and
    the smallest failing program found."""
    generation, n = ctx.generation, ctx.world_size
    groups = program_groups(n)
    handles = [dist.group.WORLD] + [g for parts in program_partitions(n) for g in ctx.new_partition(parts)]
    offered = offered_kinds(ctx, handles[0])
    programs = all_programs(generation.seed, generation.budget, groups, "p2p_tags" in ctx.target.capabilities,
                            offered)
    for number, steps in enumerate(programs):
        wait_seed = stable_seed(generation.seed, "waits", number)
        topic = f"program/{number}"
        outcome = judge_program(ctx, steps, groups, handles, wait_seed, topic)
        where = f"program {number} (seed {generation.seed}; reproduce with {generation.reproduce()})"
        if RAISED in outcome.statuses:
            if outcome.seen and outcome.statuses[ctx.rank] == RAISED:
                raise CheckFailed(f"{where}: {outcome.seen[0]}; the program: "
                                  + "; ".join(s.describe(groups) for s in steps))
            raise CheckFailed(f"rank {ctx.rank}: {where}: another rank's backend raised (its error names it); "
                              "this rank stopped there")
        if outcome.failed:
            small, seen = shrink(ctx, steps, outcome, groups, handles, wait_seed, topic)
            # every rank names what the ranks that saw a failure saw (through the store, not the backend)
            shown = " | ".join(m for m in agree(ctx, list(range(n)), f"{topic}/seen", seen[0] if seen else "") if m)
            raise CheckFailed(f"{where} failed; smallest failing program found, {len(small)} of {len(steps)} steps: "
                              + "; ".join(s.describe(groups) for s in small) + f": {shown}")
    if ctx.rank == 0:
        hit = coverage([step for steps in programs for step in steps])
        ctx.note(f"generated programs: {len(programs)} of {STEPS} steps on {len(groups)} groups (seed "
                 f"{generation.seed}, budget {generation.budget}); values hit: " + "; ".join(
                     f"{dim} {len(hit[dim])}/{len(values)}" for dim, values in dimensions().items()))
