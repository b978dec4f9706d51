"""SIGINT and SIGTERM for the command line: the first one stops the run, later ones never break the cleanup.

``install()`` puts one handler on both signals. Inside ``raising()`` (the loop over cases) the first
signal raises KeyboardInterrupt; a signal outside it, or any later one, is only recorded, so that the
pools are closed and the report of what finished is written even under a double Ctrl-C. Code between
cases asks ``requested()``, so a signal that arrived anywhere is never lost.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []
_armed = [0]
_previous: dict[int, Any] = {}


def _handle(signum: int, frame: Any) -> None:
    first = not _received
    _received.append(signum)
    if first and _armed[0]:
        raise KeyboardInterrupt(signal.Signals(signum).name)


def install() -> None:
    """Handle SIGINT and SIGTERM in this (main) thread's process until ``uninstall``."""
    if threading.current_thread() is not threading.main_thread() or _previous:
        return
    _received.clear()
    for sig in SIGNALS:
        _previous[sig] = signal.signal(sig, _handle)


def uninstall() -> None:
    """Put the previous handlers back and forget the signals received under them: ``requested()`` answers for
    the installation it was asked in (an in-process caller's later run, ``run_suite`` without ``install``, is not
    an interrupted one)."""
    for sig, handler in _previous.items():
        signal.signal(sig, handler)
    _previous.clear()
    _received.clear()


def ignore_from_now() -> None:
    """Ignore SIGINT and SIGTERM from here on: the work is done and the process is exiting.

    (Interpreter shutdown puts the default handlers back, under which a late second Ctrl-C would turn the
    exit status of a run that stopped cleanly into a death by signal.)
    """
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    _previous.clear()


def installed() -> bool:
    """True between ``install`` and ``uninstall``."""
    return bool(_previous)


def requested() -> str | None:
    """The name of the first signal received since ``install``, or None."""
    return signal.Signals(_received[0]).name if _received else None


@contextlib.contextmanager
def raising() -> Iterator[None]:
    """Within this block the first signal raises KeyboardInterrupt (at once if one already arrived)."""
    if requested():
        raise KeyboardInterrupt(requested())
    _armed[0] += 1
    try:
        yield
    finally:
        _armed[0] -= 1


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within ``raising``, a block that must not be cut midway (a queue's put holds the queue's lock, which a
    KeyboardInterrupt raised inside it leaves held): a signal is only recorded there, and raises at the end."""
    armed, _armed[0] = _armed[0], 0
    try:
        yield
    finally:
        _armed[0] = armed
    if armed and requested():
        raise KeyboardInterrupt(requested())
