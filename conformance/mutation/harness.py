"""Enumerate mutants with cosmic-ray, sample them, and judge each in a copy of the tree.

cosmic-ray's operators (``cosmic_ray.plugins``) list every mutation they make in the target's modules; a
seeded sample of them runs on ``jobs`` slots, each a copy of the tree (``conformance``, ``simulator``, the
example backend) in a temporary folder. A slot applies one mutation to its copy's source file
(``cosmic_ray.mutating.use_mutation``, which puts the original back afterwards) and runs the judge
(``conformance.mutation.judge``) there as a process group of its own, with the copy first on ``PYTHONPATH``,
so the judge and every rank process it forks or spawns import the mutated module; the working tree is never
written. A judge that outlives ``mutant_timeout_s`` is killed, group and all: that mutant is caught by timeout.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import cosmic_ray.plugins
from cosmic_ray.ast import ast_nodes, get_ast_from_path
from cosmic_ray.mutating import use_mutation

from conformance.mutation.judge import NOT_THE_TREE
from conformance.mutation.targets import MutationTarget

COPIED = ("conformance", "simulator", "examples/toyccl/toyccl", "examples/toyccl/capabilities.toml")  # judge's
KILLED, SURVIVED, TIMEOUT, CRASHED, INCOMPETENT = "killed", "survived", "timeout", "crashed", "incompetent"
CAUGHT = (KILLED, TIMEOUT, CRASHED)  # non-conformant, or the command timed out or crashed
BASELINE_TIMEOUT_S = 600.0
NEWEST_VENV = ".venvs/torch-newest"  # the newest torch's venv (ci/torch-newest.txt): survivors are judged there too
TERM_GRACE_S = 5.0  # a timed-out judge gets SIGTERM first (its pools clean up the ranks), SIGKILL after


@dataclass(frozen=True)
class Mutant:
    """One mutation cosmic-ray makes: an operator's ``occurrence``-th site in a module."""

    id: str  # path:line:col:operator, stable while the file does not change above the site
    target: str
    path: str  # relative to the repository root
    line: int
    col: int
    operator: str
    occurrence: int
    text: str = ""  # the mutated source line, stripped: with ``path`` and ``operator`` what ranks it in a sample
    same: int = 0  # how many mutants of the same path, operator and text come before it (the k-th such site)

    def rank(self, seed: int) -> str:
        """Its place in the seeded order: a hash of the seed and what the mutant changes, not where (line
        numbers shift when code above moves, the content key does not), so an edit elsewhere in the sources
        leaves every other mutant's place unchanged."""
        key = "\0".join(map(str, (seed, self.target, self.path, self.operator, self.text, self.same)))
        return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Judged:
    """A mutant's outcome: status (killed / survived / timeout / crashed), what caught it, the diff."""

    mutant: Mutant
    status: str
    seconds: float
    verdict: str = ""
    caught_by: dict[str, Any] | None = None
    diff: str = ""
    tail: str = ""  # the judge's last output lines, for a crash
    judged_on: list[str] = field(default_factory=list)  # the torch versions that judged it, in order

    def to_json(self) -> dict[str, Any]:
        """One line of a results file."""
        return asdict(self)


def source_digest(root: Path, target: MutationTarget) -> str:
    """SHA-256 over the target's sources: a results file is reused only for the same code."""
    digest = hashlib.sha256()
    for path in sorted((root / target.source).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of every annotation: under ``from __future__ import annotations`` none is evaluated, so a
    mutant there (``int | None`` to ``int % None``) changes nothing that runs."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        found: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            found += [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x]
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
        spans += [((e.lineno, e.col_offset), (e.end_lineno or e.lineno, e.end_col_offset or 0)) for e in found if e]
    return spans


def _switch_on(test: ast.expr) -> bool:
    """``test`` holds only when a planted defect switch is on: ``<...>defects.on(...)``, alone or as one
    operand of an ``and``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_switch_on(v) for v in test.values)
    return (isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == "on"
            and "defects" in ast.unparse(test.func.value))


def defect_branch_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of the code that runs only under a planted defect switch (the simulator's ``Defects``):
    the body of an ``if`` (or of a conditional expression) whose test needs a switch on. The suite judges
    the simulator with every switch off, so a mutant there cannot change what any clean run does."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and _switch_on(node.test):
            first, last = node.body[0], node.body[-1]
            spans.append(((first.lineno, first.col_offset), (last.end_lineno or last.lineno, last.end_col_offset or 0)))
        elif isinstance(node, ast.IfExp) and _switch_on(node.test):
            spans.append(((node.body.lineno, node.body.col_offset),
                          (node.body.end_lineno or node.body.lineno, node.body.end_col_offset or 0)))
    return spans


def switch_operand_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of the call-free operands of an ``and`` that also needs a defect switch on: however such
    an operand is mutated, what the ``and`` guards still needs the switch, so the mutant is equivalent on the
    clean simulator. (Triaged by this rule in the report rather than left out of the population, so that
    the seeded samples drawn before the rule stay the same.)"""
    spans = []
    for node in ast.walk(ast.parse(source)):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If | ast.IfExp) and isinstance(test, ast.BoolOp) and _switch_on(test):
            spans += [((v.lineno, v.col_offset), (v.end_lineno or v.lineno, v.end_col_offset or 0))
                      for v in test.values if not any(isinstance(c, ast.Call) for c in ast.walk(v))]
    return spans


def rule_equivalent(root: Path, mutants: list[Mutant]) -> dict[str, dict[str, str]]:
    """Triage entries for the mutants ``switch_operand_spans`` shows equivalent."""
    spans: dict[str, list[tuple[tuple[int, int], tuple[int, int]]]] = {}
    found = {}
    for m in mutants:
        if m.path not in spans:
            spans[m.path] = switch_operand_spans((root / m.path).read_text())
        if any(a <= (m.line, m.col) < b for a, b in spans[m.path]):
            found[m.id] = {"id": m.id, "class": "equivalent",
                           "why": "operand of an `and` that also needs a defect switch on: the guarded code "
                                  "still runs only under the switch (rule: harness.switch_operand_spans)"}
    return found


def target_modules(root: Path, target: MutationTarget) -> list[Path]:
    """The modules the target's mutants change: its folder's, less its ``planted`` ones, sorted."""
    return sorted(m for m in (root / target.source).glob("*.py") if m.name not in target.planted)


def _mutation_sites(modules: list[Path]) -> Iterator[tuple[Path, str, int, tuple[int, int]]]:
    """(module, operator name, occurrence, start position) of every mutation each of cosmic-ray's operators
    that takes no arguments makes, numbered as ``cosmic_ray.commands.init`` numbers them (the occurrence
    ``use_mutation`` applies), without init's work database, which took most of the enumeration's time."""
    operators = [(name, cosmic_ray.plugins.get_operator(name)) for name in cosmic_ray.plugins.operator_names()]
    for module in modules:
        nodes = list(ast_nodes(get_ast_from_path(module)))
        for name, operator_class in operators:
            if operator_class.arguments():
                continue
            operator = operator_class()
            positions = (start for node in nodes for start, _ in operator.mutation_positions(node))
            for occurrence, start in enumerate(positions):
                yield module, name, occurrence, tuple(start)


def enumerate_mutants(root: Path, target: MutationTarget) -> list[Mutant]:
    """Every mutation cosmic-ray's operators make in ``target_modules``, outside annotations and outside
    defect-switch branches (``defect_branch_spans``), in a stable order. A site an operator mutates more than
    one way (a number to n+1 and n-1) gets ``#k`` on its id."""
    modules = target_modules(root, target)
    specs = sorted(_mutation_sites(modules), key=lambda s: (str(s[0]), s[1], s[2]))
    skipped = {m: annotation_spans(m.read_text()) + defect_branch_spans(m.read_text()) for m in modules}
    lines = {m: m.read_text().splitlines() for m in modules}
    found: list[Mutant] = []
    seen: dict[str, int] = {}
    for module, operator, occurrence, (line, col) in specs:
        if any(start <= (line, col) < end for start, end in skipped[module]):
            continue
        rel = module.resolve().relative_to(root.resolve()).as_posix()
        mid = f"{rel}:{line}:{col}:{operator.removeprefix('core/')}"
        seen[mid] = seen.get(mid, 0) + 1
        mid += f"#{seen[mid]}" if seen[mid] > 1 else ""
        found.append(Mutant(mid, target.name, rel, line, col, operator, occurrence, lines[module][line - 1].strip()))
    found.sort(key=lambda m: (m.path, m.line, m.col, m.id))
    same: dict[tuple[str, str, str], int] = {}
    for i, m in enumerate(found):  # the k-th site of the same path, operator and text, in source order
        key = (m.path, m.operator, m.text)
        found[i] = replace(m, same=same.get(key, 0))
        same[key] = same.get(key, 0) + 1
    return found


def sample(mutants: list[Mutant], n: int | None, seed: int) -> list[Mutant]:
    """A seeded sample of ``n`` mutants (all of them when ``n`` is None or larger): the ``n`` lowest in the
    seeded order (``Mutant.rank``, a hash of the seed and each mutant's content key), in that order, which is
    the order they run in. The hash orders the population uniformly at random, so the sample is uniform and a
    run stopped early has judged a uniform sample too; and an edit to the sources leaves the rank of every
    mutant it does not change as it was, so the sample keeps the mutants it kept (and their triage)."""
    ranked = sorted(mutants, key=lambda m: (m.rank(seed), m.id))
    return ranked[:len(mutants) if n is None else max(0, n)]


def _copy_tree(root: Path, slot: Path) -> None:
    for rel in COPIED:
        if (root / rel).is_file():
            shutil.copy2(root / rel, slot / rel)
        else:
            shutil.copytree(root / rel, slot / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))


def _env(slot: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(slot), str(slot / "examples/toyccl")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a stale .pyc of another mutant could be read back otherwise
    return env


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the judge's process group (its pools clean up), SIGKILL what is left after the grace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


_LIVE: set[subprocess.Popen[str]] = set()  # the judges running now, stopped together on an interrupt
_LIVE_LOCK = threading.Lock()
_STOPPED = threading.Event()  # set by stop_all: a judge it killed has no outcome to record


def newest_python(root: Path) -> Path | None:
    """The interpreter of the newest torch's venv (``NEWEST_VENV`` under ``root``), if there is one."""
    python = root / NEWEST_VENV / "bin" / "python"
    return python if python.exists() else None


def torch_version(python: str | Path) -> str:
    """``torch.__version__`` as ``python`` imports it."""
    return subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], check=True,
                          capture_output=True, text=True, timeout=BASELINE_TIMEOUT_S).stdout.strip()


def run_judge(slot: Path, target: str, judge_args: list[str], timeout_s: float,
              python: str | Path = sys.executable) -> tuple[int | None, str, str]:
    """Run the judge in ``slot`` on ``python`` (another venv's interpreter: another torch): (exit code, or None
    on timeout; stdout; stderr's tail)."""
    cmd = [str(python), "-m", "conformance.mutation.judge", target, *judge_args]
    proc = subprocess.Popen(cmd, cwd=slot, env=_env(slot), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        out, err = proc.communicate()
        return None, out, err[-2000:]
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    return proc.returncode, out, err[-2000:]


def stop_all() -> None:
    """Stop every running judge with its process group (on an interrupt: they run in sessions of their own,
    so a Ctrl-C at the terminal does not reach them)."""
    _STOPPED.set()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _stop_group(proc)


def _verdict(out: str) -> dict[str, Any]:
    for line in reversed(out.splitlines()):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    return {}


def judge_mutant(slot: Path, mutant: Mutant, judge_args: list[str], timeout_s: float,
                 python: str | Path = sys.executable) -> Judged:
    """Apply ``mutant`` to the slot's copy, judge it on ``python``, put the original back."""
    operator = cosmic_ray.plugins.get_operator(mutant.operator)()
    started = time.perf_counter()
    with use_mutation(slot / mutant.path, operator, mutant.occurrence) as (before, after):
        if after is None:
            raise RuntimeError(f"{mutant.id}: cosmic-ray made no mutation (the source changed since enumeration?)")
        diff = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), mutant.path,
                                            mutant.path, n=0))
        try:  # cosmic-ray can make code that does not compile (`*` of keyword-only parameters to `**`)
            compile(after, mutant.path, "exec")
        except SyntaxError as exc:
            return Judged(mutant, INCOMPETENT, 0.0, "does not compile", diff=diff, tail=str(exc))
        rc, out, err = run_judge(slot, mutant.target, judge_args, timeout_s, python)
    seconds = round(time.perf_counter() - started, 2)
    found = _verdict(out)
    if rc == NOT_THE_TREE:
        raise RuntimeError(f"the judge imported {found.get('imported_from')}, not the copy in {slot}")
    if rc is None:
        return Judged(mutant, TIMEOUT, seconds, "timeout", diff=diff)
    if rc == 0:
        return Judged(mutant, SURVIVED, seconds, found.get("verdict", ""), diff=diff)
    if rc == 1 and found:
        return Judged(mutant, KILLED, seconds, found["verdict"], found.get("first_failure"), diff=diff)
    return Judged(mutant, CRASHED, seconds, f"judge exited {rc}", diff=diff, tail=err[-600:])


@contextlib.contextmanager
def slots(root: Path, n: int) -> Iterator[queue.Queue[Path]]:
    """``n`` copies of the tree in a temporary folder, handed out through a queue."""
    with tempfile.TemporaryDirectory(prefix="cfm-mutation-") as tmp:
        free: queue.Queue[Path] = queue.Queue()
        for i in range(n):
            slot = Path(tmp) / f"slot{i}"
            _copy_tree(root, slot)
            free.put(slot)
        yield free


def check_baseline(slot: Path, target: str, judge_args: list[str], timeout_s: float,
                   python: str | Path = sys.executable) -> float:
    """Judge the unmutated copy: it must be conformant within half the per-mutant timeout, else no mutant's
    outcome means anything (a clean run that times out would count every mutant as caught)."""
    started = time.perf_counter()
    rc, out, err = run_judge(slot, target, judge_args, BASELINE_TIMEOUT_S, python)
    seconds = time.perf_counter() - started
    if rc != 0:
        raise RuntimeError(f"the unmutated {target} is not judged conformant (exit {rc}): {out.strip()} {err[-600:]}")
    if seconds > timeout_s / 2:
        raise RuntimeError(f"the unmutated {target} took {seconds:.0f} s to judge: a per-mutant timeout of "
                           f"{timeout_s:.0f} s would count slow survivors as caught; give at least {2 * seconds:.0f}")
    return seconds


def run_mutants(root: Path, mutants: list[Mutant], jobs: int, judge_args: list[str], timeout_s: float,
                each: Callable[[Judged], None], python: str | Path = sys.executable) -> float:
    """Judge ``mutants`` on ``jobs`` slots with ``python``'s torch; ``each`` gets every outcome as it comes.
    Returns the baseline's seconds (the unmutated tree, judged first on every target involved)."""
    with slots(root, max(1, jobs)) as free:
        slot = free.get()
        baseline = max(check_baseline(slot, t, judge_args, timeout_s, python)
                       for t in sorted({m.target for m in mutants}))
        free.put(slot)

        _STOPPED.clear()

        def one(mutant: Mutant) -> None:
            slot = free.get()
            try:
                judged = judge_mutant(slot, mutant, judge_args, timeout_s, python)
                if not _STOPPED.is_set():  # an interrupt killed it: not a crash of the mutant
                    each(judged)
            finally:
                free.put(slot)

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            futures = [pool.submit(one, m) for m in mutants]
            try:
                for future in futures:
                    future.result()
            except BaseException:  # an interrupt or a harness error: no judge outlives the run
                pool.shutdown(wait=False, cancel_futures=True)
                stop_all()
                raise
    return baseline


def load_results(path: Path, digest: str) -> dict[str, dict[str, Any]]:
    """Mutant id -> its recorded outcome, from a results file written for the same sources."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["mutant"]["id"]: r for r in rows if r.get("digest") == digest}
