"""The rank process: connect to the pool's store once, then run tasks the parent sends over a pipe
(the messages of ``messages.py``)."""

from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from multiprocess.reduction import ForkingPickler

from conformance.runner.messages import RankStatus, Ready, RunTask, StorePort, TaskDone

LOOPBACK = "127.0.0.1"
# A name prefix unique to the rank pool, set in every rank: a target names what its ranks leave outside
# themselves (shared memory, files) with it, and its ``cleanup(prefix)`` removes that after a kill.
SCRATCH_ENV = "CONFORMANCE_SCRATCH"
WATCH_THREAD_NAME = "cfm-parent-watch"
_PARENT_POLL_S = 0.2
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}

_tasks: dict[str, Callable[..., Any]] = {}


def _load(task: str) -> Callable[..., Any]:
    """Resolve ``"package.module:function"``, importing the module once per process."""
    fn = _tasks.get(task)
    if fn is None:
        module, _, name = task.partition(":")
        if not name:
            raise ValueError(f"task {task!r} is not of the form 'package.module:function'")
        fn = _tasks[task] = getattr(importlib.import_module(module), name)
    return fn


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the parent dies (we are re-parented), even mid-task."""
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


def _run_one(rank: int, world_size: int, client: dist.Store, msg: RunTask) -> TaskDone:
    store = dist.PrefixStore(f"run{msg.run_id}/", client)
    started = time.perf_counter()
    try:
        value = _load(msg.task)(rank=rank, world_size=world_size, store=store, **msg.kwargs)
        status, error, tb = RankStatus.OK, "", ""
    except BaseException as exc:  # a task's SystemExit is reported, not obeyed  # noqa: BLE001
        value, status = None, RankStatus.RAISED
        error, tb = f"{type(exc).__name__}: {exc}", traceback.format_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return TaskDone(msg.run_id, status, value, error, tb, time.perf_counter() - started)


def dumps(message: object) -> bytes:
    """A pipe message's bytes: from the C pickler when it can (dill, the pipes' own pickler, is pure Python:
    20-30 us for a check's task or outcome against about 1 us), else from dill (a lambda in it, say), which
    the other end's ``recv`` reads either way."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - whatever the C pickler refuses, dill may still take
        return bytes(ForkingPickler.dumps(message))


def _send_result(conn: Any, result: TaskDone) -> None:
    try:
        conn.send_bytes(dumps(result))
    except Exception as exc:  # e.g. an unpicklable return value; the pipe is untouched  # noqa: BLE001
        error = f"task result could not be sent: {type(exc).__name__}: {exc}"
        conn.send(TaskDone(result.run_id, RankStatus.RAISED, None, error, traceback.format_exc(), result.duration_s))


def main(
    rank: int, conn: Any, *, world_size: int, parent_pid: int, env: dict[str, str], stack_path: str
) -> None:
    """Entry point of one rank process (the ``multiprocess.Process`` target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked copy of the parent's handler must not run here
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # the pool blocks them while it forks
    os.environ.update(env)
    # N ranks share few cores: torch's default intra-op threads would spin against each other.
    torch.set_num_threads(int(os.environ.get("CONFORMANCE_RANK_THREADS", "1")))
    try:
        stack_file = open(stack_path, "w")  # noqa: SIM115 - faulthandler writes to it for the process lifetime
    except FileNotFoundError:  # the pool is shutting down (a signal arrived while it forked): nothing to run
        os._exit(0)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=stack_file, all_threads=True)  # a segfault's stack goes where the pool reads it
    threading.Thread(target=_watch_parent, args=(parent_pid,), name=WATCH_THREAD_NAME, daemon=True).start()
    try:
        start: StorePort = conn.recv()
        client = dist.TCPStore(LOOPBACK, start.port, is_master=False, wait_for_workers=False)
        conn.send(Ready())
        while True:
            msg = conn.recv()
            _send_result(conn, _run_one(rank, world_size, client, msg))
    except (EOFError, OSError):
        pass  # the parent closed the pipe: we are done
