"""Try a vendor module's import in a child process first: a hang, a crash or an error becomes one line.

The child is forked from the CLI, which has imported torch but touched no device and started no thread:
it imports the module as a fresh interpreter would, without importing torch again (about 1.2 s of CPU).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import sys
import time
import traceback
from types import ModuleType

import torch.distributed as dist

_REGISTERED = "registered"  # the child's report when the import registered the backend


def imported_from(module: ModuleType) -> str:
    """Which file an import ran: the module's ``__file__``, or, for a namespace package (no ``__init__.py``:
    a directory on sys.path named like the package, which may shadow the installed one), its directories."""
    if getattr(module, "__file__", None):
        return f"from {module.__file__}"
    paths = list(dict.fromkeys(getattr(module, "__path__", ())))
    return (f"an empty namespace package from {', '.join(paths)}: a directory on sys.path without __init__.py, "
            "which may shadow the installed package") if paths else "a module with no file"


def _import_and_exit(module: str, backend: str, report_fd: int) -> None:
    """In the forked child: import ``module``, write ``_REGISTERED`` or what went wrong to ``report_fd``,
    and exit without running anything the parent registered."""
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):  # the CLI's handlers defer these; the child just ends
            signal.signal(signum, signal.SIG_DFL)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)  # the module's own output stays out of the CLI's
        os.dup2(quiet, 2)
        try:
            imported = importlib.import_module(module)
            report = _REGISTERED if dist.is_backend_available(backend) else (
                f"importing vendor module {module!r} ({imported_from(imported)}) did not register backend "
                f"{backend!r} with Backend.register_backend")
        except BaseException as exc:  # noqa: BLE001 - any failure of the import is the one line reported
            report = f"importing vendor module {module!r} failed: " + traceback.format_exception_only(exc)[-1].strip()
        os.write(report_fd, report.encode(errors="replace"))
    finally:
        os._exit(0)


def probe_import(module: str, backend: str, timeout_s: float) -> str | None:
    """None when importing ``module`` in a child process registers ``backend`` within ``timeout_s``;
    else one line saying what went wrong (hang, fatal signal, exception)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()  # or the child inherits, and could print again, what is still buffered
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _import_and_exit(module, backend, write_fd)
    os.close(write_fd)
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    try:
        while select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            if not (chunk := os.read(read_fd, 1 << 16)):  # the child has exited (or died)
                _, status = os.waitpid(pid, 0)
                pid = 0
                break
            chunks.append(chunk)
        else:
            return f"importing vendor module {module!r} did not finish within {timeout_s:g} s (a hang on import?)"
    finally:
        os.close(read_fd)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return f"importing vendor module {module!r} killed the Python process ({name})"
    report = b"".join(chunks).decode(errors="replace")
    if report:
        return None if report == _REGISTERED else report
    return f"importing vendor module {module!r} ended the process (exit code {os.WEXITSTATUS(status)})"
