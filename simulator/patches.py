"""The one way this project replaces attributes of torch's modules and classes: an undo stack.

``Patches`` records every replacement (an attribute, or an item of a mapping such as ``os.environ``)
and ``undo()`` puts each original back, the last replaced first, so that patches made inside other
patches unwind in order. The simulator's shim keeps one for as long as it is installed; the defect
matrix's planted front-end mutants use one per check. A ``Patches`` is also a context manager.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

_ABSENT = object()


class Patches:
    """Replacements made so far, undone last first by ``undo()`` (or on leaving a ``with`` block)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def __bool__(self) -> bool:
        return bool(self._undo)

    def replace(self, owner: Any, name: str, value: Any) -> Any:
        """Set ``owner.name = value``; return what ``owner.name`` was (None if nothing), what a wrapper delegates to.

        The original is restored exactly as it was stored (a classmethod stays a classmethod); an attribute
        ``owner`` only inherited, or did not have, is deleted again, so an inherited one shows through.
        """
        original = getattr(owner, name, None)
        stored = vars(owner).get(name, _ABSENT)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, stored) if stored is not _ABSENT else delattr(owner, name))
        return original

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` with ``make(original)``."""
        self.replace(owner, name, make(getattr(owner, name)))

    def set_item(self, mapping: MutableMapping[str, Any], key: str, value: Any) -> None:
        """Set ``mapping[key] = value`` (e.g. an environment variable) until undone."""
        stored = mapping.get(key, _ABSENT)
        mapping[key] = value
        self._undo.append(lambda: mapping.__setitem__(key, stored) if stored is not _ABSENT else mapping.pop(key, None))

    def undo(self) -> None:
        """Put every original back, the last replaced first."""
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Patches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()
