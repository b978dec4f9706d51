"""The rank pool's pipe protocol (one duplex pipe per rank) and how a rank's run ended.

  parent -> worker  StorePort      once, right after start
  worker -> parent  Ready          once, after connecting to the store
  parent -> worker  RunTask        per run
  worker -> parent  TaskDone       per run
EOF on the pipe, or the parent process going away, ends the worker.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class RankStatus(enum.StrEnum):
    """How one rank's run ended, as the pool saw it."""

    OK = "ok"  # the task returned
    RAISED = "raised"  # the task raised (or its result could not cross the pipe)
    CRASHED = "crashed"  # the process died
    TIMEOUT = "timeout"  # no result within the run's timeout
    ABORTED = "aborted"  # stopped by the pool after a peer crashed or failed

    @property
    def verb(self) -> str:
        """How a report says it: "rank 2 timed out"."""
        return {"ok": "returned", "raised": "raised", "crashed": "crashed", "timeout": "timed out",
                "aborted": "was abandoned after a peer failed"}[self]


@dataclass(frozen=True, slots=True)
class StorePort:
    """The port of the pool's TCPStore on loopback, and the reference of its end-of-task barrier segment
    (``worker.PoolBarrier``; empty: none)."""

    port: int
    barrier: str = ""


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker is connected to the store and waits for tasks."""


@dataclass(frozen=True, slots=True)
class RunTask:
    """Run ``task`` ("package.module:function") with ``kwargs``, as run ``run_id``."""

    run_id: int
    task: str
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TaskDone:
    """The answer to one RunTask."""

    run_id: int
    status: RankStatus
    value: Any
    error: str
    traceback: str
    duration_s: float
