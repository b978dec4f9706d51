"""Launch events name their communicator the same way whatever their source (issue 26, item 1): the launches
probe (torch's dispatcher) and the flight recorder, read by conformance.gpu.flight_recorder, give ``comm`` and
``group`` = the process group's name for the same ops. Measured on two forked CPU ranks over gloo, whose ops
torch's flight recorder records (TORCH_FR_BUFFER_SIZE), as ProcessGroupNCCL's are on a GPU."""

from __future__ import annotations

import traceback
from typing import Any

import torch
import torch.distributed as dist

from conformance.gpu import launch_events, load_dump
from conformance.probes.launches import LaunchProbe
from tests.forked import fork_and_collect


def _rank(rank: int, ports: Any, q: Any) -> None:
    try:
        store = dist.TCPStore("127.0.0.1", ports.get(timeout=30), is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
        pair = dist.new_group([0, 1], group_desc="mine")
        probe = LaunchProbe().start()
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), group=pair)
        probe.close()
        dump = load_dump(torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False))
        recorded = [(e["op"], e["comm"], e["group"]) for e in launch_events(dump) if e["op"] == "allreduce"]
        seen = [(e["op"], e["comm"], e["group"]) for e in probe.events("launch")]
        names = (dist.group.WORLD.group_name, pair.group_name)
        dist.destroy_process_group()
        q.put((rank, "ok", (seen, recorded, names)))
    except BaseException:  # reported to the test
        q.put((rank, "error", traceback.format_exc()[-2000:]))


def test_launches_probe_and_flight_recorder_name_the_group_alike(monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "100")
    results, _ = fork_and_collect(2, _rank, lambda r, ports, q: (r, ports, q), deadline_s=60)
    for rank in (0, 1):
        status, value = results[rank]
        assert status == "ok", value
        seen, recorded, (world, pair) = value
        assert seen == [("allreduce", world, world), ("allreduce", pair, pair)]
        assert recorded[-2:] == seen
