"""The one loader of the suite's TOML data files: the spec's area files and the targets' expectation files.

A data file is an array of tables (``[[requirement]]``, ``[[expect]]``); each table is validated
with a JSON Schema in this directory. Every problem is a ``SpecError`` naming the file, the entry
and the field at fault.
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

SCHEMA_DIR = Path(__file__).parent
FILE = "<file>"


class SpecError(ValueError):
    """A malformed data file (a spec area file or an expectation file): names the file, the entry
    (a requirement id, or ``#index`` when it has none) and the field at fault."""

    def __init__(self, file: str, requirement: str, field: str, problem: str) -> None:
        self.file, self.requirement, self.field = file, requirement, field
        super().__init__(f"{file}: requirement {requirement!r}, field {field!r}: {problem}")


@cache
def schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``<name>`` of this directory (e.g. ``schema.json``, a requirement)."""
    return json.loads((SCHEMA_DIR / name).read_text())


def _field(err: jsonschema.ValidationError) -> str:
    """The top-level field an error is about (for a missing or unknown one, the one its message names)."""
    if err.path:
        return str(err.path[0])
    if err.validator in ("required", "additionalProperties"):
        return err.message.split("'")[1]
    return "<entry>"


def _validate(schema_: dict[str, Any], instance: Any, file: str, entry: str) -> None:
    """Raise SpecError for the first problem of ``instance`` against ``schema_``: an unknown field first,
    then the fields in the schema's order (as a reader goes through an entry)."""
    order = list(schema_.get("properties", {}))
    errors = [(_field(e), e) for e in jsonschema.Draft202012Validator(schema_).iter_errors(instance)]
    if not errors:
        return
    field, err = min(errors, key=lambda fe: -1 if fe[1].validator == "additionalProperties" else
                     order.index(fe[0]) if fe[0] in order else len(order))
    about = schema_.get("properties", {}).get(field, {}).get("description")
    raise SpecError(file, entry, field, f"{err.message}; {about}" if about else err.message)


def load_tables(path: Path, table: str, schema_name: str, *, key: str, required: bool) -> list[dict[str, Any]]:
    """The ``[[table]]`` entries of the TOML file ``path``, each valid against ``schema_name``.

    Only the ``table`` key is allowed at the top; ``required`` means the file needs at least one
    entry. An entry is named by its ``key`` field in errors (``#index`` when that is missing).
    """
    name = path.name
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(name, FILE, "<toml>", str(exc)) from None
    layout = {"type": "object", "additionalProperties": False, "required": [table] if required else [],
              "properties": {table: {"type": "array", "items": {"type": "object"}, "minItems": int(required),
                                     "description": f"one or more [[{table}]] tables"}}}
    _validate(layout, data, name, FILE)
    entries = data.get(table, [])
    for i, entry in enumerate(entries):
        _validate(schema(schema_name), entry, name, entry_name(entry, key, i))
    return entries


def entry_name(entry: dict[str, Any], key: str, index: int) -> str:
    """How errors name an entry: its ``key`` field, else its position."""
    value = entry.get(key)
    return value if isinstance(value, str) else f"#{index}"


def version_range(text: str, file: str, entry: str, field: str) -> str:
    """``text`` when it is a torch version range (``>=2.13,<2.14``; empty means any), else SpecError."""
    try:
        SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise SpecError(file, entry, field, f"not a version range: {exc}") from None
    return text


def admits(torch_range: str, version: str) -> bool:
    """True when ``torch_range`` (empty: any torch) admits torch ``version``, local and dev tags ignored."""
    return Version(Version(version).base_version) in SpecifierSet(torch_range)
