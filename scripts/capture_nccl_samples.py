"""Capture real NCCL debug logs and flight-recorder dumps on a GPU host, as samples for tests/gpu.

Usage: ``python scripts/capture_nccl_samples.py OUT_DIR`` on a host with at least one CUDA device. One process,
world size 1 (one GPU is enough): an eager ``nccl`` world with every hint set (is_high_priority_stream,
cga_cluster_size, max_ctas, min_ctas, net_name), an all_reduce, a ``_coalescing_manager`` block of two
all_reduce, ``all_reduce_coalesced``, a ``split_group`` and a ``new_group`` child, then the flight recorder's
dumps (pickle and JSON). NCCL logs INIT and ENV to ``OUT_DIR/nccl_rank0.log``. Each step that fails is printed
with its traceback and the rest go on; the script then parses what it wrote with the suite's own parsers and
prints what they found, so a parser that misreads real output shows at once.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

HINTS = {"cga_cluster_size": 2, "max_ctas": 16, "min_ctas": 2}


def _environment(out: Path) -> None:
    os.environ.update({
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV", "NCCL_DEBUG_FILE": str(out / "nccl_rank0.log"),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT", "29533"),
        "RANK": "0", "WORLD_SIZE": "1",
    })


def _step(name: str, fn: Callable[[], object]) -> object:
    print(f"== {name}", flush=True)
    try:
        result = fn()
    except Exception:  # noqa: BLE001 - every failure is printed and the capture goes on
        traceback.print_exc()
        return None
    print(f"   ok: {result!r}"[:400], flush=True)
    return result


def _capture(out: Path) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0), flush=True)
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    for field, value in HINTS.items():
        setattr(opts.config, field, value)
    opts.config.net_name = "Socket"
    _step("init_process_group", lambda: dist.init_process_group("nccl", pg_options=opts, device_id=device))
    x = torch.arange(8, dtype=torch.float32, device=device)
    _step("all_reduce", lambda: (dist.all_reduce(x), x.tolist())[1])

    def block() -> list[float]:
        a, b = torch.ones(4, device=device), torch.full((3,), 2.0, device=device)
        with dist._coalescing_manager():
            dist.all_reduce(a)
            dist.all_reduce(b)
        return a.tolist() + b.tolist()

    _step("_coalescing_manager block of two all_reduce", block)
    _step("all_gather into an empty output list (refused?)", lambda: dist.all_gather([], x))
    _step("all_gather_into_tensor with a short output (refused?)",
          lambda: dist.all_gather_into_tensor(torch.empty(3, device=device), x))
    _step("all_reduce_coalesced", lambda: dist.all_reduce_coalesced([torch.ones(2, device=device)]))
    child = _step("split_group", lambda: dist.split_group(split_ranks=[[0]], group_desc="captured_split"))
    if child is not None:
        _step("all_reduce on the split child", lambda: dist.all_reduce(torch.ones(5, device=device), group=child))
    other = _step("new_group", lambda: dist.new_group([0], group_desc="captured_new_group"))
    if other is not None:
        _step("all_reduce on the new group", lambda: dist.all_reduce(torch.ones(6, device=device), group=other))
    torch.cuda.synchronize()
    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_nccl_trace", None)
    dump_json = getattr(c10d, "_dump_nccl_trace_json", None)
    if dump is not None:
        data = _step("flight recorder pickle", lambda: dump(includeCollectives=True, includeStackTraces=False,
                                                            onlyActive=False))
        if isinstance(data, bytes):
            (out / "fr_nccl_rank0.pkl").write_bytes(data)
    if dump_json is not None:
        text = _step("flight recorder json", lambda: dump_json(includeCollectives=True, onlyActive=False))
        if isinstance(text, (str, bytes)):  # torch 2.11 returns bytes
            (out / "fr_nccl_rank0.json").write_text(json.dumps(json.loads(text), indent=1) + "\n")
    _step("destroy_process_group", dist.destroy_process_group)


def _parse(out: Path) -> None:
    from conformance.gpu.flight_recorder import launch_events, load_dump
    from conformance.gpu.nccl_log import parse_nccl_log_file

    log = out / "nccl_rank0.log"
    if log.exists():
        for event in parse_nccl_log_file(log):
            print("log event:", event, flush=True)
    for name in ("fr_nccl_rank0.pkl", "fr_nccl_rank0.json"):
        path = out / name
        if path.exists():
            data = path.read_bytes() if name.endswith(".pkl") else path.read_text()
            for event in launch_events(load_dump(data)):
                print(f"{name} launch:", event, flush=True)


def main() -> int:
    """Capture into the directory named by the one argument, then parse what was captured."""
    if len(sys.argv) != 2:
        print("usage: python scripts/capture_nccl_samples.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    _environment(out)
    _capture(out)
    _step("parse with the suite's parsers", lambda: _parse(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
