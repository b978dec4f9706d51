"""Persistent pools of rank processes: run one task on N ranks, with timeout, crash and hang handling."""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import multiprocess
import torch.distributed as dist
from multiprocess.connection import wait

from conformance import interrupts
from conformance.runner import worker
from conformance.runner.messages import RankStatus, RunTask, StorePort, TaskDone

START_TIMEOUT_S = 120.0  # spawn on a loaded 2-core machine can take a while
PEER_GRACE_S = 0.5  # how long peers of a crashed or failed rank may still answer before they are killed
TERM_GRACE_S = 0.5  # SIGTERM -> SIGKILL
STACK_WAIT_S = 1.0  # how long to wait for a faulthandler dump

_pool_ids = itertools.count(1)
# Ranks of GPU targets are spawned: a rank forked from a parent that touched CUDA cannot use it.
GPU_START_METHOD = "spawn"


@dataclass
class RankReport:
    """What one rank did in one run."""

    rank: int
    status: RankStatus
    value: Any = None  # what the task returned (run_check: a RankOutcome in its wire form)
    error: str = ""
    traceback: str = ""
    exitcode: int | None = None
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        self.status = RankStatus(self.status)  # a spelling that is no status fails here, not where it is read


@dataclass
class _Worker:
    rank: int
    process: Any
    conn: Any
    stack_path: str
    stack_mark: int = 0


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _fatal_stack(w: _Worker) -> str:
    """The faulthandler dump a fatal signal (SIGSEGV, SIGABRT, ...) wrote during this run, or ""."""
    try:
        with open(w.stack_path) as f:
            f.seek(w.stack_mark)
            text = f.read()
    except OSError:
        return ""
    return f"Python stacks of rank {w.rank} (pid {w.process.pid}) at the crash:\n{_readable_stack(text)}" \
        if text.strip() else ""


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _readable_stack(dump: str) -> str:
    """Trim a faulthandler dump: drop the parent-watch thread and the frames below the worker loop."""
    entry = f'{os.sep}worker.py", line '
    kept = []
    for block in dump.strip().split("\n\n"):
        if worker._watch_parent.__name__ in block:
            continue
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if entry in line and line.endswith(f" in {worker.main.__name__}"):
                lines = lines[: i + 1]
                break
        kept.append("\n".join(lines))
    return "\n\n".join(kept)


def _closed(proc: Any) -> bool:
    """True for a Process object already closed (its pid and sentinel released)."""
    try:
        proc.is_alive()
    except ValueError:
        return True
    return False


@contextlib.contextmanager
def signals_blocked() -> Any:
    """Block SIGINT and SIGTERM in this thread (so in the processes it forks) for the block's duration."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, worker.STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _dump_stacks(workers: list[_Worker]) -> dict[int, str]:
    """Ask each (live) worker for a faulthandler dump of all its threads; return rank -> text."""
    before: dict[int, int] = {}
    for w in workers:
        try:
            size = os.path.getsize(w.stack_path)
            os.kill(w.process.pid, signal.SIGUSR1)
        except OSError:
            continue
        before[w.rank] = size
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline and any(
        os.path.getsize(w.stack_path) <= before[w.rank] for w in workers if w.rank in before
    ):
        time.sleep(0.01)
    time.sleep(0.05)  # let a dump in progress finish
    stacks = {}
    for w in workers:
        text = ""
        if w.rank in before:
            with open(w.stack_path) as f:
                f.seek(before[w.rank])
                text = _readable_stack(f.read())
        header = f"Python stacks of rank {w.rank} (pid {w.process.pid}):\n"
        stacks[w.rank] = header + (text or "<no stack: the process did not answer SIGUSR1>")
    return stacks


class RankPool:
    """``world_size`` persistent rank processes that run tasks together, sharing one TCPStore.

    The pool starts at construction; after a timeout or a crash it is killed and started again
    lazily by the next ``run``. ``rebuilds`` counts the starts (1 after construction).
    """

    def __init__(self, world_size: int, *, start_method: str = "fork", env: dict[str, str] | None = None):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.pool_id = next(_pool_ids)
        self.scratch = f"cfm{os.getpid()}p{self.pool_id}_"  # worker.SCRATCH_ENV in the ranks
        self.rebuilds = 0
        self._ctx = multiprocess.get_context(start_method)
        self._env = {**(env or {}), worker.SCRATCH_ENV: self.scratch}
        self._cleanups: dict[str, Callable[[str], None]] = {}
        self._workers: list[_Worker] = []
        self._store: dist.TCPStore | None = None
        self._barrier: worker.PoolBarrier | None = None
        self._run_ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._stack_dir = ""
        _track(self)  # first: the pool is closed at exit whatever point a Ctrl-C interrupts from here on
        try:
            self._stack_dir = tempfile.mkdtemp(prefix=f"{self.scratch}stacks-")
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers, in rank order (empty while the pool is down)."""
        return [w.process.pid for w in self._workers]

    # -- lifecycle -------------------------------------------------------------------------------

    def _start(self) -> None:
        sys.stdout.flush()  # or the workers inherit, and later print, what is still buffered
        sys.stderr.flush()
        try:
            # A SIGINT/SIGTERM that arrives while forking reaches a new child only once it has set its own
            # handlers. This thread's mask does not keep the KeyboardInterrupt out of this process, though:
            # another thread (a store's) may take the signal, and Python raises it here. So a worker is listed
            # before it starts, and _kill() ends it whatever line that lands on; an unlisted started one would
            # be joined forever by multiprocess at exit (a double Ctrl-C during certify hung it for 90 s).
            # The fork loop also defers the command line's KeyboardInterrupt to its end: raised inside
            # proc.start() after the fork, it would leave a child whose pid the Process never learnt, which
            # _kill() could not end and which could write into the stack directory while close() removes it.
            with signals_blocked(), interrupts.deferred():
                for rank in range(self.world_size):
                    parent_conn, child_conn = self._ctx.Pipe()
                    stack_path = os.path.join(self._stack_dir, f"rank{rank}.stack")
                    open(stack_path, "w").close()  # created here: a rank only opens it, never creates a file
                    proc = self._ctx.Process(
                        target=worker.main,
                        args=(rank, child_conn),
                        kwargs={"world_size": self.world_size, "parent_pid": os.getpid(), "env": self._env,
                                "stack_path": stack_path},
                        name=f"cfm-pool{self.pool_id}-rank{rank}",
                    )
                    self._workers.append(_Worker(rank, proc, parent_conn, stack_path))
                    proc.start()
                    child_conn.close()
            self.rebuilds += 1
            port = self._serve_store()
            try:  # after forking, as the store: no copy in a rank
                self._barrier = worker.PoolBarrier(self.world_size)
            except (AttributeError, OSError):  # no memfd here (not Linux): the ranks meet through the store
                self._barrier = None
            for w in self._workers:
                w.conn.send(StorePort(port, self._barrier.ref if self._barrier is not None else ""))
            self._await_ready()
        except BaseException:
            self._kill()
            raise

    def _serve_store(self) -> int:
        """Host this pool's TCPStore on a socket bound to loopback only; return its port.

        It is created after forking, so that the workers of this pool hold no copy of it.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((worker.LOOPBACK, 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        self._store = dist.TCPStore(
            worker.LOOPBACK, port, is_master=True, wait_for_workers=False, master_listen_fd=sock.detach()
        )
        return port

    def _await_ready(self) -> None:
        waiting = {w.conn: w for w in self._workers}
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting:
            handles = [*waiting, *(w.process.sentinel for w in waiting.values())]
            ready = wait(handles, max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"pool of size {self.world_size} did not start in {START_TIMEOUT_S:g} s")
            for conn in [c for c in ready if c in waiting]:
                with contextlib.suppress(EOFError, OSError):
                    conn.recv()
                    del waiting[conn]
            dead = [w for w in waiting.values() if not w.process.is_alive()]
            if dead:
                reason = _exit_reason(dead[0].process.exitcode)
                raise RuntimeError(f"rank {dead[0].rank} of a new pool died at start ({reason})")

    def on_kill(self, name: str, cleanup: Callable[[str], None]) -> None:
        """After every kill, call ``cleanup(self.scratch)`` (one per ``name``: a target's ``cleanup``), so
        that what the ranks left outside themselves under the scratch name is removed."""
        self._cleanups[name] = cleanup

    def _kill(self) -> None:
        """Kill every worker (SIGTERM, then SIGKILL), drop the store, run the cleanups (``on_kill``).

        Safe to call again after an interrupted call (a Process already closed is skipped).
        """
        procs = [w.process for w in self._workers if not _closed(w.process) and w.process.pid is not None]
        for proc in procs:
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.join(5.0)
            if proc.exitcode is not None:
                proc.close()
        for w in self._workers:
            w.conn.close()
            with contextlib.suppress(OSError):
                os.unlink(w.stack_path)
        self._workers = []
        self._store = None
        if self._barrier is not None:
            self._barrier.close()
            self._barrier = None
        for cleanup in list(self._cleanups.values()):
            cleanup(self.scratch)

    def close(self) -> None:
        """Terminate the workers, join them, run the cleanups and remove this pool's stack files."""
        self._closed = True
        try:
            self._kill()
        finally:
            # by its name, which is this process's and this pool's alone: also one that mkdtemp made but a
            # Ctrl-C kept from being assigned to _stack_dir
            for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{self.scratch}stacks-*")):
                shutil.rmtree(path, ignore_errors=True)
        _live.discard(self)

    # -- running ---------------------------------------------------------------------------------

    def run(self, task: str, kwargs: dict, timeout_s: float,
            failed: Callable[[Any], bool] | None = None) -> list[RankReport]:
        """Run ``task`` ("package.module:function") on every rank; one report per rank, in rank order.

        Each rank calls ``function(rank=r, world_size=N, store=<PrefixStore fresh for this run>,
        **kwargs)``. Waits at most ``timeout_s`` for all ranks. Once a rank crashes, raises, or returns
        a value ``failed`` accepts, the others get PEER_GRACE_S more; those still running are then
        reported "aborted" (with their stacks) and the pool is rebuilt.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("run() on a closed RankPool")
            if not self._workers or not all(w.process.is_alive() for w in self._workers):
                self._kill()
                self._start()
            return self._run(task, kwargs, timeout_s, failed)

    def _run(self, task: str, kwargs: dict, timeout_s: float,
             failed: Callable[[Any], bool] | None) -> list[RankReport]:
        run_id = next(self._run_ids)
        for w in self._workers:  # where a fatal signal's faulthandler dump of this run will start
            w.stack_mark = _size(w.stack_path)
        payload = worker.dumps(RunTask(run_id, task, kwargs))
        started = time.monotonic()
        for w in self._workers:
            with contextlib.suppress(OSError):  # a dead worker shows up through its sentinel
                w.conn.send_bytes(payload)
        reports: dict[int, RankReport] = {}
        by_handle = {h: w for w in self._workers for h in (w.conn, w.process.sentinel)}
        deadline = started + timeout_s
        crashed: list[int] = []
        broken: list[int] = []  # ranks that raised or whose value ``failed`` accepts
        while len(reports) < self.world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            handles = [h for h, w in by_handle.items() if w.rank not in reports]
            for handle in wait(handles, remaining):
                w = by_handle[handle]
                if w.rank in reports:
                    continue
                report = self._receive(w, run_id, started)
                if report is not None:
                    reports[w.rank] = report
                    bad = crashed if report.status is RankStatus.CRASHED else broken if (
                        report.status is RankStatus.RAISED
                        or (report.status is RankStatus.OK and failed is not None and failed(report.value))) else None
                    if bad is not None:
                        bad.append(w.rank)
                        deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
        missing = [w for w in self._workers if w.rank not in reports]
        if missing:
            stacks = _dump_stacks(missing)
            elapsed = time.monotonic() - started
            if crashed:
                status, error = RankStatus.ABORTED, f"abandoned after rank(s) {crashed} crashed"
            elif broken:
                status = RankStatus.ABORTED
                error = f"no result {elapsed:.1f} s into the run, after rank(s) {broken} failed"
            else:
                status, error = RankStatus.TIMEOUT, f"no result after {timeout_s:g} s"
            for w in missing:
                reports[w.rank] = RankReport(w.rank, status, error=error, traceback=stacks[w.rank],
                                             duration_s=elapsed)
        if missing or crashed:
            self._kill()
        return [reports[r] for r in range(self.world_size)]

    def _receive(self, w: _Worker, run_id: int, started: float) -> RankReport | None:
        """Read the answer of a worker whose pipe or sentinel is ready; None if it was not for this run."""
        if w.conn.poll():
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                msg = None
            except Exception as exc:  # the result arrived but does not unpickle here  # noqa: BLE001
                return RankReport(w.rank, RankStatus.RAISED, error=f"unreadable result: {type(exc).__name__}: {exc}",
                                  duration_s=time.monotonic() - started)
            if msg is not None:
                done: TaskDone = msg
                if done.run_id != run_id:
                    return None
                return RankReport(w.rank, done.status, done.value, done.error, done.traceback,
                                  duration_s=done.duration_s)
        w.process.join(1.0)
        if w.process.exitcode is None:  # pipe readable but process alive and silent: not an answer
            return None
        code = w.process.exitcode
        return RankReport(w.rank, RankStatus.CRASHED, error=_exit_reason(code), traceback=_fatal_stack(w),
                          exitcode=code, duration_s=time.monotonic() - started)


class PoolSet:
    """One RankPool per world size, created on first use, closed at exit."""

    def __init__(self, start_method: str = "fork", env: dict[str, str] | None = None):
        self._start_method = start_method
        self._env = env
        self._pools: dict[tuple[int, str], RankPool] = {}
        atexit.register(self.close)

    def get(self, world_size: int, start_method: str | None = None) -> RankPool:
        """The pool for ``world_size`` (ranks started by ``start_method``, default the set's), started on first use."""
        key = (world_size, start_method or self._start_method)
        pool = self._pools.get(key)
        if pool is None:
            pool = RankPool(world_size, start_method=key[1], env=self._env)
            self._pools[key] = pool
        return pool

    def fresh(self, world_size: int, start_method: str | None = None) -> RankPool:
        """A new pool like ``get``'s that is not kept: the caller closes it (a check needing processes of its own)."""
        return RankPool(world_size, start_method=start_method or self._start_method, env=self._env)

    def close(self) -> None:
        """Close every pool of this set."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


# -- process-exit cleanup: every live pool is closed at interpreter exit and on SIGTERM ----------

_live: weakref.WeakSet[RankPool] = weakref.WeakSet()
_hooks_installed = False


def _close_live() -> None:
    for pool in list(_live):
        pool.close()


def _track(pool: RankPool) -> None:
    global _hooks_installed
    _live.add(pool)
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_close_live)
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the process handles SIGTERM itself (the CLI stops the run and closes its pools)

    def on_sigterm(signum: int, frame: Any) -> None:
        _close_live()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
