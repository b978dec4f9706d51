"""Write reports atomically (JSON + Markdown) and load them back with schema validation."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from conformance.report.build import validate_report
from conformance.report.markdown import render_markdown


def safe_stem(target: str) -> str:
    """A file-name stem for ``target``: characters outside [A-Za-z0-9._-] become '_'."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", target).lstrip(".")
    if not stem:
        raise ValueError(f"target name {target!r} gives no usable file name")
    return stem


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and os.replace."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is as readable as any file the user writes
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(
    report: dict[str, Any], report_dir: Path, statements: dict[str, str] | None = None
) -> tuple[Path, Path]:
    """Validate, then write ``<dir>/<target>.json`` and ``<dir>/<target>.md`` atomically."""
    validate_report(report)
    text = json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n"
    markdown = render_markdown(report, statements)
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    stem = safe_stem(report["target"])
    json_path, md_path = report_dir / f"{stem}.json", report_dir / f"{stem}.md"
    atomic_write_text(json_path, text)
    atomic_write_text(md_path, markdown)
    return json_path, md_path


def load_report(path: Path) -> dict[str, Any]:
    """Read a report JSON file; raises jsonschema.ValidationError if it breaks the schema."""
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    validate_report(report)
    return report
