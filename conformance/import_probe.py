"""Try a vendor module's import in a child process first: a hang, a crash or an error becomes one line."""

from __future__ import annotations

import select
import signal
import subprocess
import sys

# Importing torch in the child, before the vendor module's own time starts; generous for a loaded host.
TORCH_IMPORT_S = 120.0
_CHILD = """
import importlib, sys
import torch.distributed as dist
print("torch", flush=True)
module, backend = sys.argv[1:3]
importlib.import_module(module)
if not dist.is_backend_available(backend):
    sys.exit(f"importing {module!r} did not register backend {backend!r} with Backend.register_backend")
"""


def probe_import(module: str, backend: str, timeout_s: float) -> str | None:
    """None when importing ``module`` in a fresh interpreter registers ``backend`` within ``timeout_s``;
    else one line saying what went wrong (hang, fatal signal, exception)."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, module, backend], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], TORCH_IMPORT_S)
        if not ready:
            return f"a fresh Python process did not import torch within {TORCH_IMPORT_S:g} s"
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"importing vendor module {module!r} did not finish within {timeout_s:g} s (a hang on import?)"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return f"importing vendor module {module!r} killed the Python process ({name})"
    last = next((line for line in reversed(err.splitlines()) if line.strip()), f"exit code {proc.returncode}")
    return f"importing vendor module {module!r} failed: {last.strip()}"
