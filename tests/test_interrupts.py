"""SIGINT, SIGTERM and a double SIGINT at several moments of `run`, `certify` and `defects`: no report or a
complete valid `interrupted: true` one, never a wrong one; no process, shm segment, temp dir or listening
socket left behind."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conformance.report import load_report
from tests.forked import alive

ROOT = Path(__file__).resolve().parents[1]
ARGS = {
    "run": ["run", "--target", "sim", "--world-sizes", "2,4"],
    "certify": ["certify", "--backend", "toyccl", "--device", "cpu", "--import", "toyccl", "--world-sizes", "2,4"],
    "defects": ["defects", "--world-sizes", "2"],
}
REPORT = {"run": "sim.json", "certify": "toyccl.json", "defects": "defects.json"}
# Results printed before a "mid" interrupt: a progress line each ("[ 3/102] ..."; torch's own "[W...]" warnings
# do not count). certify's first two lines are skips decided before any rank runs: its third has run on the
# pools. A defect result comes after the matrix's clean run (a whole suite run): two are enough there.
MID_RESULTS = {"run": 6, "certify": 3, "defects": 2}
PROGRESS = re.compile(r"\[\s*\d+/\d+\] ")


def _forks(root: int, pids: set[int]) -> set[int]:
    """The processes of ``pids`` that run ``root``'s own executable: its forked ranks, not the helpers torch's
    import runs (the CUDA builds run ``ldconfig -p`` while importing, before any signal handler is installed)."""
    def exe(pid: int) -> str | None:
        try:
            return os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return None

    own = exe(root)
    return {pid for pid in pids if own is not None and exe(pid) == own}


def _tree(root: int) -> set[int]:
    """Every live descendant of ``root``."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=False).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        pid, ppid = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found



def _listening_ports(pids: set[int]) -> set[int]:
    """TCP ports in LISTEN state on sockets that ``pids`` hold open."""
    inodes = set()
    for pid in pids:
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return {port for port, inode in _listen_table() if inode in inodes}


def _listen_table() -> list[tuple[int, str]]:
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    rows.append((int(fields[1].rsplit(":", 1)[1], 16), fields[9]))
    return rows


@contextlib.contextmanager
def _sigint_not_ignored():
    """Let the children started in this block begin with SIGINT at its default. A shell starts a background
    job with SIGINT ignored, and an ignored signal stays ignored across exec: a pytest started from there
    would never see the simulated Ctrl-C. (A handler, unlike SIG_IGN, is reset to the default by exec.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _signal(proc: subprocess.Popen, how: str) -> None:
    if how == "int":  # Ctrl-C at a terminal reaches the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    elif how == "term":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.15)
        os.killpg(proc.pid, signal.SIGINT)


# run, certify and defects take SIGTERM and a second SIGINT in one interrupts.raising block: run tries every signal
# mid-run, certify (its vendor import and capability probe ahead of the pools) SIGINT; defects' own code is the
# lanes' stop on a first signal and on a second one. At the fork, SIGINT on run and on certify: the fork loop blocks
# SIGINT and SIGTERM alike (pool.signals_blocked), and tests/runner/test_pool.py's deferred-signal test sends SIGTERM
CASES = [("run", how, "mid") for how in ("int", "term", "double")]
CASES += [("certify", "int", "mid"), ("defects", "int", "mid"), ("defects", "double", "mid")]
CASES += [("run", "int", "fork"), ("certify", "int", "fork")]


@pytest.mark.parametrize(("command", "how", "when"), CASES)
def test_interrupted_run_leaves_a_valid_report_or_none_and_nothing_behind(command, how, when, tmp_path) -> None:
    report_dir = tmp_path / "reports"
    with _sigint_not_ignored():
        proc = subprocess.Popen([sys.executable, "-m", "conformance", *ARGS[command], "--report-dir", str(report_dir)],
                                cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    seen: set[int] = set()
    ports: set[int] = set()
    deadline = time.monotonic() + 120
    while not _forks(proc.pid, seen) and time.monotonic() < deadline and proc.poll() is None:
        seen |= _tree(proc.pid)
        time.sleep(0.01)
    assert _forks(proc.pid, seen), "the command started no rank processes"
    if when == "mid":  # a few results in, pools and store up (and seen: the results can come before a first look)
        while (sum(map(bool, map(PROGRESS.match, lines))) < MID_RESULTS[command] or not ports) \
                and time.monotonic() < deadline and proc.poll() is None:
            seen |= _tree(proc.pid)
            ports |= _listening_ports({proc.pid} | seen)
            time.sleep(0.02)
        assert ports, "no listening store socket seen: the leak check would not observe one"
    assert proc.poll() is None, "the command ended before it was interrupted"
    _signal(proc, how)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"{command} did not stop within 90 s of SIG{how.upper()}") from None
    reader.join(10)
    err = "".join(lines)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 3, (proc.returncode, err[-3000:])
    path = report_dir / REPORT[command]
    if command == "defects":
        assert not path.exists() and not (report_dir / "defects.md").exists()
        assert "interrupted" in err
    elif path.exists():
        report = load_report(path)  # validates the schema
        assert report["interrupted"] is True and report["verdict"] == "incomplete"
        assert when == "fork" or report["results"], "a run interrupted mid-way kept none of what finished"
        assert path.with_suffix(".md").exists()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(alive, seen)):
        time.sleep(0.05)
    assert not [p for p in seen if alive(p)], "rank processes left behind"
    prefix = f"cfm{proc.pid}p"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)], "shm segments left behind"
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"{prefix}*")), "temp dirs left behind"
    assert not ports & {port for port, _ in _listen_table()}, "store sockets still listening"
    assert not list(report_dir.glob(".*")), "temporary report files left behind"


# a second SIGINT is pytest's and xdist's to handle; the suite's part, its report, goes through the same
# write_report (a temp file and os.replace) as run's, whose double SIGINT is tried above. SIGTERM is not handled by
# pytest: what ends then is the pools' own SIGTERM handler, tried in tests/runner/test_pool.py
# (test_dead_parent_leaves_no_worker) and above under run: this test sends SIGINT
def test_interrupted_pytest_xdist_run_leaves_a_marked_report_or_none(tmp_path) -> None:
    report_dir = tmp_path / "reports"
    with _sigint_not_ignored():
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "conformance/suite",
             "--conformance-targets=sim", "--conformance-world-sizes=2,4", f"--conformance-report-dir={report_dir}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(lambda: proc.stdout.read(1), "")), daemon=True)
    reader.start()
    seen: set[int] = set()
    deadline = time.monotonic() + 180
    while sum(c in ".sxF" for c in out) < 8 and time.monotonic() < deadline and proc.poll() is None:
        seen |= _tree(proc.pid)
        time.sleep(0.02)
    assert proc.poll() is None, "pytest ended before it was interrupted: " + "".join(out)[-2000:]
    _signal(proc, "int")
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("pytest did not stop within 120 s of the interrupt") from None
    reader.join(10)
    path = report_dir / "sim.json"
    if path.exists():
        report = load_report(path)
        assert report["interrupted"] is True and report["verdict"] == "incomplete", "".join(out)[-2000:]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(map(alive, seen)):
        time.sleep(0.05)
    assert not [p for p in seen if alive(p)], "processes left behind"
    prefixes = tuple(f"cfm{pid}p" for pid in seen | {proc.pid})
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefixes)], "shm segments left behind"
    assert not [d for d in os.listdir(tempfile.gettempdir()) if d.startswith(prefixes)], "temp dirs left behind"
