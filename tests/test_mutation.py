"""The mutation harness (``python -m conformance mutate``): fixed mutants known to be killed are killed, a
known-equivalent one survives, a judge past its timeout dies with its process group, and the judge refuses to
judge code that is not the copy's."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conformance.mutation import harness, report
from conformance.mutation.command import ROOT, add_arguments, cmd_mutate
from conformance.mutation.targets import TARGETS


def _site(path: str, text: str, col: int, operator: str) -> str:
    """The id of the mutant at ``col`` of the one line of ``path`` holding ``text``: ids are positions, and
    lines move as the code around them changes."""
    lines = [n for n, line in enumerate((ROOT / path).read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (path, text, lines)
    return f"{path}:{lines[0]}:{col}:{operator}"


KILLED = {  # mutant -> the requirement whose MUST fails first on it (judged at world size 2)
    _site("simulator/reduction.py", 'if op == "avg":', 11, "AddNot"): "SPLIT-VALIDATION",  # AVG never divided
    _site("examples/toyccl/toyccl/backend.py", "bad = [r for r in ranks if not 0 <= r < self.size()]", 46,
          "ReplaceComparisonOperator_Lt_LtE"): "SPLIT-VALIDATION",  # a split naming rank == size accepted
}
# the refusal's range text only ("valid group ranks are 0..{size - 1}"): SPLIT-VALIDATION runs that refusal and
# rightly does not care
EQUIVALENT = _site("simulator/backend.py", "(valid group ranks are 0..", 75, "ReplaceBinaryOperator_Sub_BitAnd")
JUDGED_BY = "SPLIT-VALIDATION"  # kills both of KILLED in a few seconds: a short test


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--results-dir", str(tmp_path / "results"), "--report-dir", str(tmp_path), *extra])


def _other_torch(tmp_path: Path) -> Path:
    """An interpreter that says its torch is another release (what ``--newest-torch`` asks first) and runs
    anything else on this one: the second stage's path, at the cost of one more judge."""
    python = tmp_path / "other-python"
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo 0.0.0+other; exit 0; fi\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.slow
def test_fixed_mutants_are_killed_and_an_equivalent_one_survives(tmp_path: Path) -> None:
    ids = [*KILLED, EQUIVALENT]
    args = _args(tmp_path, "--target", "simulator,toyccl", "--world-sizes", "2", "--jobs", "2",
                 "--requirement", JUDGED_BY, "--newest-torch", str(_other_torch(tmp_path)), "--other-stacks", "off",
                 *(a for i in ids for a in ("--mutant", i)))
    said: list[str] = []
    cmd_mutate(args, say=said.append)
    built = json.loads((tmp_path / "mutation.json").read_text())
    caught = {**built["targets"]["simulator"]["caught"], **built["targets"]["toyccl"]["caught"]}
    for mid, requirement in KILLED.items():
        assert caught.get(mid, {}).get("status") == "killed", (mid, said)
        assert caught[mid]["caught_by"]["requirement"] == requirement, caught[mid]
    survivors = built["targets"]["simulator"]["survivors"]
    assert [r["mutant"]["id"] for r in survivors] == [EQUIVALENT], said
    # the survivor was judged again on the other torch (and survived there too); the killed ones were not
    import torch

    assert survivors[0]["judged_on"] == [torch.__version__, "0.0.0+other"], survivors[0]
    assert all(c["judged_on"] == [torch.__version__] for c in caught.values()), caught
    md = (tmp_path / "mutation.md").read_text()
    assert md.count(EQUIVALENT) == 1 and "survivors again on torch 0.0.0+other (0 caught only there)" in md


def _after(path: str, text: str, col: int, operator: str) -> str:
    """The id of the mutant at ``col`` of the line after the one line of ``path`` holding ``text``."""
    line = int(_site(path, text, col, operator).split(":")[1]) + 1
    return f"{path}:{line}:{col}:{operator}"


@pytest.mark.slow
def test_a_survivor_of_the_default_stack_is_judged_on_the_others(tmp_path: Path) -> None:
    # nccl-lazy's pair stream name reads pair[2] of a 2-tuple: every send on that stack raises, on no other
    lazy_only = _after("simulator/stacks.py", "comm = self._pair_comm(pair)", 61, "NumberReplacer")
    # --timeout 60: P2P-DATA takes 3 s here but passed 15 s on CI's loaded host (-n 3 on 2 cores, stage 2
    # installing), and a clean check past its timeout kills the mutant on the default stack; this mutant raises
    # at once where it is caught, so a longer timeout costs nothing
    args = _args(tmp_path, "--target", "simulator", "--world-sizes", "2", "--jobs", "1", "--requirement", "P2P-DATA",
                 "--timeout", "60",
                 "--newest-torch", "off", "--other-stacks", "torchcomms,nccl-lazy", "--mutant", lazy_only)
    said: list[str] = []
    cmd_mutate(args, say=said.append)
    import torch

    caught = json.loads((tmp_path / "mutation.json").read_text())["targets"]["simulator"]["caught"][lazy_only]
    # survived the default stack and torchcomms, killed on nccl-lazy: each judgement listed, the last one named
    assert caught["judged_on"] == [torch.__version__, f"{torch.__version__} stack=torchcomms",
                                   f"{torch.__version__} stack=nccl-lazy"], (said, caught)
    assert caught["caught_by"]["requirement"] == "P2P-DATA" and caught["caught_by"]["stack"] == "nccl-lazy", caught
    assert (f"survivors again on the other stacks (nccl-lazy, torchcomms on torch {torch.__version__}; 1 caught only "
            "there)") in (tmp_path / "mutation.md").read_text()


def test_enumeration_skips_annotations_and_defect_switch_branches() -> None:
    source = textwrap.dedent('''
        from __future__ import annotations
        def f(x: int | None, defects) -> int:
            if x > 1 and defects.on("d"):
                return x + 1
            if not defects.on("e"):
                return x - 1
            return x * 2 if defects.on("f") else x
    ''')
    skipped = harness.annotation_spans(source) + harness.defect_branch_spans(source)
    inside = {pos for pos in [(3, 10), (3, 34), (5, 15), (7, 15), (8, 15), (8, 33)]
              if any(a <= pos < b for a, b in skipped)}
    # the annotations, the body of the switch's if and the switch's arm of the conditional; not the body of
    # `if not defects.on(...)` (it runs with every switch off), nor the test, nor the other arm
    assert inside == {(3, 10), (3, 34), (5, 15), (8, 15)}


def test_the_planted_defect_modules_are_not_mutated() -> None:
    # the flaw classes and their table are planted defects: no clean run executes them (enumerate_mutants
    # mutates target_modules only; toyccl's enumeration below shows it)
    paths = {m.relative_to(ROOT).as_posix() for m in harness.target_modules(ROOT, TARGETS["simulator"])}
    assert {"simulator/flaws.py", "simulator/defects.py", "simulator/faults.py"}.isdisjoint(paths)
    assert {"simulator/backend.py", "simulator/parts.py", "simulator/stacks.py"} <= paths


@pytest.fixture(scope="module")
def toyccl_mutants() -> list[harness.Mutant]:
    """toyccl's mutants, enumerated once for the tests of this module (seconds each time)."""
    return harness.enumerate_mutants(ROOT, TARGETS["toyccl"])


def test_mutant_ids_are_unique_and_stable(toyccl_mutants: list[harness.Mutant]) -> None:
    first = toyccl_mutants
    again = harness.enumerate_mutants(ROOT, TARGETS["toyccl"])
    assert [m.id for m in first] == [m.id for m in again]
    assert {m.path for m in first} == {m.relative_to(ROOT).as_posix()
                                       for m in harness.target_modules(ROOT, TARGETS["toyccl"])}
    assert len({m.id for m in first}) == len(first) > 100
    assert all(m.path.startswith("examples/toyccl/toyccl/") for m in first)


def test_a_mutant_that_does_not_compile_is_not_judged(toyccl_mutants: list[harness.Mutant]) -> None:
    mutant = next(m for m in toyccl_mutants
                  if "ReplaceBinaryOperator_Mul_Pow" in m.id and _is_star_marker(m))
    with harness.slots(ROOT, 1) as free:
        judged = harness.judge_mutant(free.get(), mutant, [], timeout_s=1.0)
    assert judged.status == harness.INCOMPETENT and judged.seconds == 0.0


def _is_star_marker(m: harness.Mutant) -> bool:
    line = (ROOT / m.path).read_text().splitlines()[m.line - 1]
    return line[m.col:m.col + 3] == "*, "


def test_a_judge_past_its_timeout_is_killed_with_its_process_group(tmp_path: Path) -> None:
    slot = tmp_path / "slot"
    (slot / "conformance/mutation").mkdir(parents=True)
    (slot / "conformance/__init__.py").write_text("")
    (slot / "conformance/mutation/__init__.py").write_text("")
    pid_file = tmp_path / "child.pid"
    (slot / "conformance/mutation/judge.py").write_text(textwrap.dedent(f'''
        import subprocess, time
        child = subprocess.Popen(["sleep", "60"])  # stands for a rank process the judge forked
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
    '''))
    started = time.monotonic()
    rc, _, _ = harness.run_judge(slot, "simulator", [], timeout_s=1.5)
    assert rc is None and time.monotonic() - started < harness.TERM_GRACE_S + 5
    child = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # reaped by init once its parent is gone
            os.kill(child, 0)
            time.sleep(0.1)


def test_the_judge_refuses_code_that_is_not_the_trees_own() -> None:
    # in the repository root toyccl is the installed copy, not examples/toyccl/toyccl: judging it would
    # judge no mutant
    proc = subprocess.run([sys.executable, "-m", "conformance.mutation.judge", "toyccl"], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "site-packages" in json.loads(proc.stdout)["imported_from"]


def test_the_score_leaves_out_equivalent_and_incompetent_mutants() -> None:
    def row(mid: str, status: str) -> dict:
        return {"mutant": {"id": mid}, "status": status, "seconds": 1.0}

    rows = [row("a", "killed"), row("b", "timeout"), row("c", "survived"), row("d", "survived"),
            row("e", "incompetent"), row("f", "crashed")]
    triage = {"c": {"class": "equivalent", "why": "logging only"}, "d": {"class": "gap", "why": "no check"}}
    s = report.summarize(rows, triage)
    assert (s["judged"], s["equivalent"], s["gaps"], s["incompetent"]) == (5, 1, 1, 1)
    assert s["score"] == 0.75 and s["raw_score"] == 0.6


def test_a_triage_entry_written_for_another_line_is_stale() -> None:
    # an id is a position: once code above it moves, the same id names another mutation, which the old
    # entry must not triage
    def row(mid: str, removed: str) -> dict:
        return {"mutant": {"id": mid}, "status": "survived", "seconds": 1.0,
                "diff": f"--- f.py\n+++ f.py\n@@ -3 +3 @@\n-    {removed}\n+    mutated\n"}

    rows = [row("a", "x = 1"), row("b", "y = 2")]
    triage = {"a": {"class": "equivalent", "why": "w", "line": "x = 1"},
              "b": {"class": "equivalent", "why": "w", "line": "z = 3"}}
    s = report.summarize(rows, triage)
    assert (s["equivalent"], s["untriaged"], s["gaps"]) == (1, 1, 1)
    assert report.triage_of(rows[1], triage) is None and report.mutated_line(rows[0]["diff"]) == "x = 1"


def test_the_mutated_line_of_a_removed_decorator_is_the_decorator() -> None:
    # RemoveDecorator's diff removes the blank line above the decorator first
    diff = "--- f.py\n+++ f.py\n@@ -129,2 +128,0 @@\n-\n-    @property\n"
    assert report.mutated_line(diff) == "@property"


def test_the_triage_entries_name_their_line() -> None:
    assert all(e["line"] for e in report.load_triage().values())


def _mutant(mid: str, text: str, same: int = 0) -> harness.Mutant:
    path, line, col, operator = mid.split(":")
    return harness.Mutant(mid, "t", path, int(line), int(col), "core/" + operator, 0, text, same)


def test_the_sample_is_stable_under_edits_elsewhere() -> None:
    # the seeded order ranks a mutant by what it changes, not where: lines added above every site shift each id
    # but leave the sample the same mutants, and a new mutant takes only its own place in the order
    population = [_mutant(f"m.py:{n}:4:NumberReplacer", f"x = {n}") for n in range(1, 200)]
    moved = [_mutant(f"m.py:{m.line + 7}:4:NumberReplacer", m.text) for m in population]
    extra = _mutant("m.py:1:4:NumberReplacer", "y = 0")
    first = [m.text for m in harness.sample(population, 30, seed=5)]
    assert [m.text for m in harness.sample(moved, 30, seed=5)] == first
    grown = [m.text for m in harness.sample([extra, *moved], 30, seed=5)]
    assert [t for t in grown if t != "y = 0"] == first[:len(grown) - (extra.text in grown)]
    assert [m.text for m in harness.sample(population, 10, seed=5)] == first[:10]  # a prefix: stopped early
    assert [m.text for m in harness.sample(population, 30, seed=6)] != first
    # the same text twice: the k-th site tells them apart
    twins = [_mutant("m.py:1:4:NumberReplacer", "x = 0", 0), _mutant("m.py:9:4:NumberReplacer", "x = 0", 1)]
    assert twins[0].rank(1) != twins[1].rank(1)


def test_enumeration_gives_each_mutant_its_text_and_same_key_index(toyccl_mutants: list[harness.Mutant]) -> None:
    population = toyccl_mutants
    for m in population[:50]:
        assert m.text == (ROOT / m.path).read_text().splitlines()[m.line - 1].strip()
    keys = [(m.path, m.operator, m.text, m.same) for m in population]
    assert len(set(keys)) == len(keys)


def test_a_triage_entry_carries_to_the_same_change_moved() -> None:
    def row(mid: str, removed: str, made: str) -> dict:
        return {"mutant": {"id": mid}, "status": "survived", "seconds": 1.0,
                "diff": f"--- f.py\n+++ f.py\n@@ -3 +3 @@\n-    {removed}\n+    {made}\n"}

    triage = {"f.py:3:8:NumberReplacer": {"id": "f.py:3:8:NumberReplacer", "class": "equivalent", "why": "w",
                                          "line": "x = 1", "mutated": "x = 2"}}
    moved = row("f.py:9:8:NumberReplacer", "x = 1", "x = 2")
    assert report.triage_of(moved, triage)["carried_from"] == "f.py:3:8:NumberReplacer"
    # another change of the same line, another operator, another file: not carried
    assert report.triage_of(row("f.py:9:8:NumberReplacer#2", "x = 1", "x = 0"), triage) is None
    assert report.triage_of(row("f.py:9:8:ReplaceBinaryOperator_Add_Sub", "x = 1", "x = 2"), triage) is None
    assert report.triage_of(row("g.py:9:8:NumberReplacer", "x = 1", "x = 2"), triage) is None
    # a line whose text is on several lines of its file: which of them the entry was written for is unknown
    assert report.triage_of({**moved, "line_repeats": 2}, triage) is None
    # its own id with the same change: applied directly, not carried
    assert "carried_from" not in report.triage_of(row("f.py:3:8:NumberReplacer", "x = 1", "x = 2"), triage)
    built = report.build({"t": {"command": "c", "torch": "t", "population": 1, "seed": 0, "digest": "d",
                                "wall_seconds": 1.0, "rows": [moved]}}, triage)
    assert "equivalent (carried from `f.py:3:8:NumberReplacer`)" in report.render(built)


def test_a_kill_by_a_hang_carries_where_the_stuck_ranks_were() -> None:
    from conformance.mutation.judge import STACK_TAIL, _stuck
    from conformance.outcomes import Outcome
    from conformance.report.model import RankOutcome, Result

    dump = "x" * STACK_TAIL + "File simulator/control.py, line 188 in wait_until"
    ranks = [RankOutcome(0, Outcome.ERROR, "RankTimeout: ranks [1] never arrived"),
             RankOutcome(1, Outcome.ERROR, "no result", traceback=dump, status="timeout")]
    hung = Result("API-LIFECYCLE", "api", "MUST", 2, Outcome.ERROR, "rank 0: RankTimeout", 15.0, ranks=ranks)
    assert _stuck(hung) == {"stacks": {1: dump[-STACK_TAIL:]}}
    assert _stuck(Result("P2P-DATA", "p2p", "MUST", 2, Outcome.FAIL, "wrong data", 1.0, ranks=ranks[:1])) == {}


def test_the_simulator_target_lists_every_stack_the_simulator_models() -> None:
    from simulator.stacks import STACKS

    # targets.py names them without importing the simulator (listing targets must not load torch)
    assert TARGETS["simulator"].stacks == tuple(STACKS)
