"""Warnings a check requires, recorded as raised and sorted by whether a user would see them.

A check records every warning of a block (``recorded``), whatever filters the run has, and then counts only those
of a category Python's default filters show: DeprecationWarning (outside ``__main__``), PendingDeprecationWarning,
ImportWarning and ResourceWarning are ignored by default (Python docs, warnings, 'Default Warning Filter'), so a
warning raised as one of those reaches nobody who has not asked for it. torch raises its C++ warnings (TORCH_WARN,
as ProcessGroupNCCL's) as UserWarning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from conformance.checks.registry import CheckContext

HIDDEN_BY_DEFAULT: tuple[type[Warning], ...] = (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                                                ResourceWarning)


@contextmanager
def recorded() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning raised in the block, each one even when it repeats."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def matching(caught: list[warnings.WarningMessage], wanted: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """The messages of ``caught`` that ``wanted`` accepts: (those a user sees, those Python's default filters hide,
    each of the latter given as '<Category>: <message>')."""
    shown: list[str] = []
    hidden: list[str] = []
    for w in caught:
        message = str(w.message)
        if not wanted(message):
            continue
        if issubclass(w.category, HIDDEN_BY_DEFAULT):
            hidden.append(f"{w.category.__name__}: {message}")
        else:
            shown.append(message)
    return shown, hidden


def expect_shown(ctx: CheckContext, hidden: list[str], what: str) -> None:
    """``what`` must not come as a warning of a category Python's default filters hide."""
    ctx.expect(not hidden, f"{what}: the warning's category", "one Python's default filters show (UserWarning)",
               f"{hidden[:2]}: hidden by default" if hidden else hidden)
