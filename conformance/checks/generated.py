"""Running a plan's generated cases inside a check, and shrinking the first failure to the smallest one found.

Every member runs every case (``Findings`` keeps them in lockstep). The members then agree, through the
store rather than the backend under test, on the first case that failed on any of them; the shrinker
re-runs smaller candidates of it collectively, each judged by the same agreement, so every member takes
the same shrink decisions. The failure names the seed and the smallest failing case found.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator

import torch

from conformance.checks import cases as gen_cases
from conformance.checks.cases import Case, Plan
from conformance.checks.common import Findings
from conformance.checks.registry import CheckContext
from conformance.outcomes import CheckFailed

MAX_SHRINK_STEPS = 16  # candidates tried at most, whatever they give (a fixed count: every rank stops alike)
# What a declined case is re-run with, so that its other dimensions' boundary values still run.
FALLBACK = {"op": "SUM", "dtype": torch.float32, "dtype mix": "float32", "values": "full range"}
RunOne = Callable[[Case], None]


class CaseError(RuntimeError):
    """Why a sweep stopped after a generated case raised (the case itself is among the failures)."""


class Declined(Exception):
    """The target refused the case's op or dtype with a named refusal (noted by ``optional_case``)."""


def _attempt(run_one: RunOne, case: Case, plan: Plan | None = None) -> tuple[str, str | Exception | None]:
    """("ok", None), ("mismatch", message) or ("raised", exception). A declined case is re-run once with the
    common op, dtype and values (``FALLBACK``) in place of its own, when ``plan`` admits that combination."""
    try:
        run_one(case)
    except Declined:
        fallback = {k: v for k, v in FALLBACK.items() if k in dict(case.dims)}
        retry = case.with_(**fallback)
        if plan is None or retry == case or not plan.valid(dict(retry.dims)):
            return "ok", None
        return _attempt(run_one, retry)
    except CheckFailed as exc:
        return "mismatch", str(exc)
    except Exception as exc:  # noqa: BLE001 - the caller stops the sweep on it, as Findings does
        return "raised", exc
    return "ok", None


def agree(ctx: CheckContext, members: list[int], topic: str, value: str) -> list[str]:
    """Every member's ``value`` for ``topic`` (the same list on every member), exchanged through the store."""
    count = ctx.agreements.get(topic, 0)
    ctx.agreements[topic] = count + 1
    key = f"generated/{ctx.requirement.id}/{topic}/{count}"
    ctx.store.set(f"{key}/{ctx.rank}", value.encode())
    keys = [f"{key}/{m}" for m in members]
    ctx.store.wait(keys, datetime.timedelta(seconds=ctx.timeout_s))
    return [ctx.store.get(k).decode() for k in keys]


def raise_shared(ctx: CheckContext, topic: str, finding: str, owner: int) -> None:
    """Raise rank ``owner``'s ``finding`` (empty: none) on every rank of the world, learned through the store, not
    the backend (which a failed op may have left waiting): every rank fails alike, none waits out a timeout."""
    shared = agree(ctx, list(range(ctx.world_size)), topic, finding)[owner]
    if shared:
        raise CheckFailed(shared)


def candidates(case: Case, world_size: int) -> Iterator[Case]:
    """Simpler variants of ``case``: smaller sizes first (smallest first, then half), then the other
    dimensions at their simplest value (flat layout, small values, tag 0, first root, fewer ops)."""
    dims = dict(case.dims)
    if "size" in dims:
        dtype = dims.get("dtype", gen_cases.ALL_DTYPES[0])
        for label in gen_cases.smaller_sizes(dims["size"], dtype, world_size):
            yield case.with_(size=label)
        count = gen_cases.numel(dims["size"], dtype, world_size)
        if count > 8:
            yield case.with_(size=f"~{count // 2 * dtype.itemsize}B+0e")
    simplest = {"layout": "flat", "in_layout": "flat", "out_layout": "flat", "values": "small", "tag": 0,
                "root": 0, "source": "named"}
    for dim, value in simplest.items():
        if dim in dims and dims[dim] != value:
            yield case.with_(**{dim: value})
    if "count" in dims and dims["count"] > 1:
        yield case.with_(count=1)
        yield case.with_(count=dims["count"] // 2)


def _shrink(ctx: CheckContext, case: Case, run_one: RunOne, members: list[int], topic: str,
            message: str | None) -> tuple[Case, str | None, Exception | None]:
    """Greedy shrinking: adopt the first candidate that still fails on some member; repeat."""
    steps, improved = 0, True
    while improved and steps < MAX_SHRINK_STEPS:
        improved = False
        for candidate in candidates(case, len(members)):
            if steps >= MAX_SHRINK_STEPS:
                break
            steps += 1
            status, detail = _attempt(run_one, candidate)
            if status == "raised":  # the members may no longer agree on what comes next: stop here
                agree(ctx, members, topic, status)
                return case, message, detail  # type: ignore[return-value]
            statuses = agree(ctx, members, topic, status)
            if "raised" in statuses:
                return case, message, None
            if "mismatch" in statuses:
                case, message, improved = candidate, detail if status == "mismatch" else None, True  # type: ignore[assignment]
                break
    return case, message, None


def run_plan(ctx: CheckContext, found: Findings, plan: Plan, run_one: RunOne, members: list[int],
             label: str) -> list[Case]:
    """Run ``plan``'s cases for ``members`` (the group this rank runs them on) and shrink the first failure.

    Returns the cases run (for coverage). Failures go to ``found``; an error stops the sweep as there.
    """
    generation = ctx.generation
    cases = plan.cases(generation, len(members))
    first: tuple[int, str] | None = None
    for case in cases:
        if found.raised is not None:
            return cases
        status, detail = _attempt(run_one, case, plan)
        if status == "raised":  # a backend error on a valid case: a failure naming it; the sweep stops here
            found.failures.append(f"rank {ctx.rank}: {case.describe()}: raised {type(detail).__name__}: {detail} "
                                  f"(seed {generation.seed}, reproduce with {generation.reproduce()})")
            found.raised = CaseError("the members may no longer agree on what comes next")
            return cases
        if status == "mismatch":
            found.failures.append(f"{detail} [{case.describe()}]")
            first = first or (case.index, str(detail))
    topic = f"{label}/{plan.name}"
    indices = [int(v) for v in agree(ctx, members, topic, str(first[0] if first else -1)) if int(v) >= 0]
    if ctx.rank == 0 and plan.name not in ctx.covered:  # one line per plan in the report
        ctx.covered.add(plan.name)
        hit = plan.coverage(cases)
        ctx.note(f"generated {plan.name}: {len(cases)} cases (seed {generation.seed}, budget {generation.budget}); "
                 "boundary values hit: " + "; ".join(f"{d} {len(v)}/{len(plan.dims[d])}" for d, v in hit.items()))
    if not indices:
        return cases
    start = cases[min(indices)]
    mine = first[1] if first and first[0] == start.index else None
    small, message, raised = _shrink(ctx, start, run_one, members, topic, mine)
    if raised is not None:
        found.raised = raised
    if message is not None:
        found.failures.insert(0, f"smallest failing case found (seed {generation.seed}; reproduce with "
                                 f"{generation.reproduce()}): {small.describe()}: {message}")
    return cases
