"""The NCCL debug-log and flight-recorder parsers, on the samples in tests/gpu/samples."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest

from conformance.gpu import flight_recorder, launch_events, load_dump, parse_nccl_log, parse_nccl_log_file

SAMPLES = Path(__file__).parent / "samples"


def test_nccl_230_init_split_and_p2p_comms():
    logged = parse_nccl_log_file(SAMPLES / "nccl_2.30_rank0.log")
    events = [e for e in logged if e["kind"] == "comm_created"]
    assert [e["comm"] for e in events] == ["0x55d0c1a2b3c0", "0x55d0c3f10a80", "0x55d0c4a00010"]
    assert [(e["kind"], e["comm"], e["how"]) for e in logged if e not in events] == [
        ("comm_destroyed", "0x55d0c4a00010", "destroy")]
    world, split, pair = events
    assert all(e["kind"] == "comm_created" and e["backend"] == "nccl" for e in events)
    assert (world["rank"], world["nranks"], world["device"]) == (0, 4, "cuda:0")
    assert world["parent"] is None and world["mode"] is None
    assert world["comm_hash"] == "0x8f3a6c1d22e0b4a7"
    assert world["function"] == "ncclCommInitRankConfig"
    assert world["config"] == {
        "blocking": 1, "cga_cluster_size": 2, "min_ctas": 4, "max_ctas": 16, "net_name": "IB"
    }
    assert world["network"] == "IB"  # logged before its Init START (NCCL 2.30.7 src/init.cc:486, :1912)
    assert (split["parent"], split["mode"]) == ("0x55d0c1a2b3c0", "split")
    assert (split["nranks"], split["color"]) == (2, 0)
    assert split["config"] == {"blocking": 1, "cga_cluster_size": 2, "max_ctas": 16}
    assert split["comm_hash"] is None
    assert pair["nranks"] == 2 and pair["parent"] is None
    assert pair["config"] == {"max_ctas": 8}  # the NCCL_MAX_CTAS override line
    assert (split["network"], pair["network"]) == ("IB", "Socket")


def test_truncated_and_foreign_lines_are_skipped():
    events = parse_nccl_log_file(SAMPLES / "nccl_2.30_rank0.log")
    assert "0x55d0c5b00020" not in {e["comm"] for e in events}  # its two lines are cut short
    assert parse_nccl_log(["x:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks", "", "\x00\xff", "NCCL INFO"]) == []


def test_nccl_221_split_with_timestamps():
    events = parse_nccl_log_file(SAMPLES / "nccl_2.21_rank1.log")
    assert len(events) == 2
    parent, child = events
    assert (parent["rank"], parent["nranks"], parent["device"]) == (1, 2, "cuda:1")
    assert parent["config"] == {"cga_cluster_size": 4}
    assert child["parent"] == parent["comm"] and child["mode"] == "split"
    assert (child["rank"], child["nranks"], child["color"]) == (0, 1, 1)
    # 2.21/2.22 log a split's commId as the hash of "<parent hash>-<color>" (v2.21.5 src/init.cc:1529, :1541)
    assert child["comm_hash"] == "0x6be1c0a1f49a2d73"
    assert child["config"] == {"min_ctas": 2}


def test_nccl_218_complete_line_without_function():
    (event,) = parse_nccl_log_file(SAMPLES / "nccl_2.18_rank0.log")
    assert (event["comm"], event["nranks"], event["function"]) == ("0x1a2b3c4d5e60", 8, None)
    assert event["config"] == {}


def test_log_offset_and_missing_file(tmp_path):
    path = SAMPLES / "nccl_2.30_rank0.log"
    text = path.read_bytes()
    offset = text.index(b"gpu-node-07:41215:41215 [0] NCCL INFO Rank 0 has color")
    assert [(e["kind"], e["comm"]) for e in parse_nccl_log_file(path, offset)] == [
        ("comm_created", "0x55d0c4a00010"), ("comm_destroyed", "0x55d0c4a00010")]
    assert parse_nccl_log_file(tmp_path / "absent.log") == []


def _nccl_dump() -> dict:
    return load_dump((SAMPLES / "fr_nccl_constructed_rank0.json").read_bytes())


def test_flight_recorder_nccl_blocks():
    events = launch_events(_nccl_dump())
    summary = [(e["comm"], e["op"], e["ops"], e["coalesced"]) for e in events]
    assert summary == [
        ("0", "allreduce", 1, False),
        ("0", "allreduce", 2, True),
        ("0", "allreduce", 3, True),
        ("0", "send", 1, False),
        ("0", "sendrecv", 2, True),
        ("1", "allreduce", 1, False),
        ("0", "allgather", 1, False),  # "nccl:_all_gather_base", as ProcessGroupNCCL titles it
    ]
    assert events[5]["group_desc"] == "split_0_1" and events[5]["state"] == "scheduled"
    assert all(e["backend"] == "nccl" and e["kind"] == "launch" for e in events)
    assert 10 not in {e["record_id"] for e in events}  # the malformed entry


def test_flight_recorder_pickle_and_after_record_id():
    dump = _nccl_dump()
    assert launch_events(load_dump(pickle.dumps(dump))) == launch_events(dump)
    later = launch_events(dump, after_record_id=5)
    assert [e["record_id"] for e in later] == [8, 9, 11]


def test_flight_recorder_block_cut_by_ring_buffer():
    dump = _nccl_dump()
    dump["entries"] = dump["entries"][2:4]  # one member lost to the ring buffer
    (event,) = launch_events(dump)
    assert (event["op"], event["ops"], event["coalesced"]) == ("allreduce", 1, True)


@pytest.mark.parametrize("name", ["fr_gloo_torch2.13_rank0.pkl", "fr_gloo_torch2.13_rank0.json"])
def test_flight_recorder_captured_gloo(name):
    events = launch_events(load_dump((SAMPLES / name).read_bytes()))
    assert [(e["comm"], e["group_desc"], e["op"], e["ops"]) for e in events] == [
        ("0", "default_pg", "allreduce", 1),
        ("0", "default_pg", "allreduce", 1),
        ("1", "mine", "allreduce", 1),
    ]
    assert all(e["backend"] == "gloo" and not e["coalesced"] for e in events)


def test_load_dump_rejects_other_data():
    with pytest.raises(ValueError, match="not a flight-recorder dump"):
        load_dump(json.dumps([1, 2]))


def test_nccl_probe_reads_only_what_came_after_setup(tmp_path, monkeypatch):
    from conformance.targets import nccl

    fr = (SAMPLES / "fr_nccl_constructed_rank0.json").read_bytes()
    dump = json.loads(fr)
    log = tmp_path / "rank0.log"
    lines = (SAMPLES / "nccl_2.30_rank0.log").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "ncclCommSplit" in line) - 3
    log.write_text("".join(lines[:cut]))
    dump["entries"] = dump["entries"][:5]
    probe = nccl.NcclProbe(log, dump=lambda: load_dump(pickle.dumps(dump)), groups=dict)
    assert probe.observes == {"comm_created", "launch"}
    assert probe.events() == []  # the world comm and 5 records predate the probe
    with log.open("a") as fh:
        fh.write("".join(lines[cut:]))
    dump["entries"] = json.loads(fr)["entries"]
    comms = probe.events("comm_created")
    assert [(e["comm"], e["parent"]) for e in comms] == [
        ("0x55d0c3f10a80", "0x55d0c1a2b3c0"),
        ("0x55d0c4a00010", None),
    ]
    assert [e["record_id"] for e in probe.events("launch")] == [5, 8, 9, 11]
    mark = probe.mark()
    assert probe.events(since=mark) == []


def test_gpu_targets_say_why_they_cannot_run_here():
    import torch

    from conformance.targets.nccl import NcclTarget
    from conformance.targets.torchcomms import TorchcommsTarget

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    reason = NcclTarget().unavailable_reason(2)
    assert reason.startswith("no CUDA device visible") and torch.__version__ in reason
    assert "torchcomms" in TorchcommsTarget().unavailable_reason()
    assert "torchcomms" in TorchcommsTarget().capabilities


def _entry(record_id: int, name: str, seq: int, p2p_seq: int, is_p2p: bool) -> dict:
    return {"record_id": record_id, "process_group": ["0", "default_pg"], "profiling_name": name,
            "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "is_p2p": is_p2p, "input_sizes": [[8]],
            "state": "completed"}


def test_flight_recorder_p2p_batch_does_not_absorb_the_collective_before_it():
    # Constructed (keys as in fr_nccl_constructed_rank0.json): an all_reduce, then a batch_isend_irecv
    # whose closing "nccl:coalesced" entry is not marked p2p and carries the all_reduce's
    # collective_seq_id, the recording issue 12 lead 7 describes.
    dump = {"version": "2.10", "entries": [
        _entry(0, "nccl:all_reduce", 5, 2, False),
        _entry(1, "nccl:send 0->1", 5, 3, True),
        _entry(2, "nccl:recv 0<-1", 5, 3, True),
        _entry(3, "nccl:coalesced", 5, 3, False),
        _entry(4, "nccl:all_reduce", 6, 3, False),
        _entry(5, "nccl:all_reduce", 6, 3, False),
        _entry(6, "nccl:coalesced", 6, 3, False),
    ]}
    summary = [(e["op"], e["ops"], e["coalesced"], e["record_id"]) for e in launch_events(dump)]
    assert summary == [("allreduce", 1, False, 0), ("sendrecv", 2, True, 3), ("allreduce", 2, True, 6)]


# Constructed lines in the formats of NCCL 2.30.7 src/init.cc:1912 (Init START), :1945 (Init COMPLETE)
# and :486 (Using network): a 4-rank world comm, then one 2-rank comm no group owns.
_WORLD = ("h:9:{tid} [{dev}] NCCL INFO {pre}ncclCommInitRankConfig comm 0x7{rank}00 rank {rank} nranks 4 cudaDev {dev} "
          "nvmlDev {dev} busId 1{dev}000 commId 0xaaaa0000aaaa0000 - Init {phase}")
_PAIR = ("h:9:{tid} [{dev}] NCCL INFO {pre}ncclCommInitRankConfig comm 0x{ptr}{rank}00 rank {prank} nranks 2 "
         "cudaDev {dev} nvmlDev {dev} busId 1{dev}000 commId 0x{cid} - Init {phase}")


def _lines(fmt: str, **kw) -> str:
    return "".join(fmt.format(phase=p, pre="[Rank 0] " if p == "START" else "", **kw) + "\n"
                   for p in ("START", "COMPLETE"))


def test_nccl_probe_modes_and_pair_members_from_the_store(tmp_path, monkeypatch):
    import torch.distributed as dist

    from conformance.targets import nccl

    monkeypatch.setattr(nccl, "PAIR_WAIT_S", 0.05)
    owners = {f"0x7{r}00": ("0", [0, 1, 2, 3]) for r in range(4)}
    store = dist.HashStore()
    probes, logs = {}, {}
    for rank in (1, 3):
        logs[rank] = tmp_path / f"rank{rank}.log"
        logs[rank].write_text("")
        probes[rank] = nccl.NcclProbe(logs[rank], groups=lambda: owners)
        with logs[rank].open("a") as fh:  # the world comm, made while init_process_group ran (eager)
            fh.write(_lines(_WORLD, tid=10, dev=rank, rank=rank))
        probes[rank].world_initialised(store, rank)
    (world,) = probes[1].events("comm_created")
    assert (world["mode"], world["members"]) == ("eager", [0, 1, 2, 3])
    for rank, prank in ((1, 0), (3, 1)):  # later, a 2-rank comm between ranks 1 and 3
        with logs[rank].open("a") as fh:
            fh.write(_lines(_PAIR, tid=20, dev=rank, rank=rank, prank=prank, ptr=8, cid="bbbb0000bbbb0001"))
    first = probes[1].events("comm_created")[1]
    assert first["mode"] == "p2p" and first["members"] is None  # rank 3 has not read its log yet
    pair3 = probes[3].events("comm_created")[1]
    pair1 = probes[1].events("comm_created")[1]
    assert (pair1["mode"], pair1["members"]) == ("p2p", [1, 3])
    assert (pair3["mode"], pair3["members"], pair3["rank"]) == ("p2p", [1, 3], 1)
    owners["0x9300"] = ("5", [1, 3])  # a comm a live group owns, made after init: lazy
    with logs[3].open("a") as fh:
        fh.write(_lines(_PAIR, tid=30, dev=3, rank=3, prank=1, ptr=9, cid="cccc0000cccc0002"))
    assert probes[3].events("comm_created")[2]["mode"] == "lazy"


def test_pair_members_when_a_commid_comes_back(tmp_path, monkeypatch):
    # A comm made after one was destroyed may reuse its commId (real: e07's rank 1 re-init logs
    # 0x56bea185a98d5193 again). Ranks 0 and 1 make a pair comm with commId X in one check; in a later check
    # (new probes, the same run store) ranks 0 and 2 make one with the same X: its members are 0 and 2.
    import torch.distributed as dist

    from conformance.targets import nccl

    monkeypatch.setattr(nccl, "PAIR_WAIT_S", 0.05)
    store = dist.HashStore()
    members = {}
    for check, pair in enumerate(((0, 1), (0, 2))):
        probes = {}
        for prank, rank in enumerate(pair):
            log = tmp_path / f"check{check}-rank{rank}.log"
            log.write_text("")
            probes[rank] = nccl.NcclProbe(log, groups=dict)
            probes[rank].world_initialised(store, rank)
            log.write_text(_lines(_PAIR, tid=20, dev=rank, rank=rank, prank=prank, ptr=8, cid="56bea185a98d5193"))
        for rank in pair:
            probes[rank].events()
        members[pair] = [probes[rank].events("comm_created")[0]["members"] for rank in pair]
    assert members == {(0, 1): [[0, 1], [0, 1]], (0, 2): [[0, 2], [0, 2]]}


def real_fr_dump() -> dict:
    """f01 (the PyTorch tutorial's dump of torch's test_short_pickle, tests/gpu/samples/real) as the
    tutorial prints it: JSON but for ``process_group``, a tuple, which the JSON dump writes as a list."""
    text = (SAMPLES / "real" / "f01_fr_pytorch_tutorial_test_short_pickle_v2.5.txt").read_text()
    return load_dump(re.sub(r'\("([^"]*)", "([^"]*)"\)', r'["\1", "\2"]', text))


def test_flight_recorder_real_dump_names_the_group_as_every_launch_source():
    (event,) = launch_events(real_fr_dump())
    assert (event["op"], event["ops"], event["coalesced"], event["state"]) == ("allreduce", 1, False, "completed")
    assert (event["comm"], event["group"], event["group_desc"]) == ("0", "0", "default_pg")


def test_flight_recorder_op_names_torch_records():
    # Real profiling names (v2.15.0 libtorch_cuda.so; torch's analyser, flight_recorder/components/types.py), each in
    # an entry of the real dump's shape: what the launches probe calls the same op.
    names = {"nccl:all_reduce_barrier": "barrier", "nccl:_all_gather_base": "allgather",
             "nccl:_reduce_scatter_base": "reduce_scatter", "nccl:all_gather_into_tensor_coalesced": "allgather",
             "nccl:reduce_scatter_tensor_coalesced": "reduce_scatter", "nccl:_broadcast_oop": "broadcast",
             "nccl:_reduce_oop": "reduce", "nccl:gather_single": "gather", "nccl:all_to_all": "alltoall",
             "gloo:all_to_all_single": "alltoall", "nccl2:allgather_coalesced": "allgather"}
    template = real_fr_dump()["entries"][0]
    dump = {"version": "2.5", "entries": [dict(template, record_id=i, profiling_name=name)
                                          for i, name in enumerate(names)]}
    assert [e["op"] for e in launch_events(dump)] == list(names.values())


def test_flight_recorder_knows_every_name_torch_analyser_lists():
    from torch.distributed.flight_recorder.components import types

    # this torch's list; "split" and "new_window" are recorded but are no launch
    unmapped = {n for n in (types.COLLECTIVES | types.P2P) - {"split", "new_window"} if n not in flight_recorder._OPS}
    assert not unmapped, f"recorded op names the reader keeps raw: {sorted(unmapped)}"


@pytest.mark.parametrize("engine", [False, True])
def test_nccl_target_does_not_claim_launches_on_processgroupnccl2(monkeypatch, engine):
    # ProcessGroupNCCL2 (2.15's "nccl") records its ops through c10d's FlightRecorderHook, per dispatcher op and
    # with no coalescing-block entry: the probe does not read them (conformance/targets/nccl.py module doc)
    from conformance.targets import nccl

    monkeypatch.setattr(nccl, "nccl_is_torchcomms_engine", lambda: engine)
    monkeypatch.setattr(nccl, "flight_recorder_usable", lambda: True)
    target = nccl.NcclTarget()
    assert ("launch" in target.observes) is not engine
    env = target.environment()
    assert env["nccl_backend"] == ("ProcessGroupNCCL2" if engine else "ProcessGroupNCCL")
    assert env.get("nccl_probe") == (nccl.NCCL2_PROBE_NOTE if engine else None)
