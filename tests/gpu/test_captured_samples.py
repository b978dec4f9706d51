"""The parsers on output captured on a GPU host by scripts/capture_nccl_samples.py (torch 2.11.0+cu130, NCCL
2.28.9, one H200, world size 1): tests/gpu/samples/README.md says what each file holds."""

from pathlib import Path

from conformance.gpu.flight_recorder import launch_events, load_dump
from conformance.gpu.nccl_log import parse_nccl_log_file

CAPTURED = Path(__file__).parent / "samples" / "captured"
HINTS = {"cga_cluster_size": 2, "min_ctas": 2, "max_ctas": 16, "net_name": "Socket"}


def test_the_world_its_split_child_and_a_new_group_are_read_from_nccl_2_28_9():
    events = parse_nccl_log_file(CAPTURED / "nccl_2.28.9_torch2.11_h200_ws1_rank0.log")
    world, child, other = [e for e in events if e["kind"] == "comm_created"]
    assert world["function"] == "ncclCommInitRankConfig" and world["parent"] is None
    assert world["comm_hash"] == "0x7199e745134e0637"
    assert world["config"] == {"blocking": 1, **HINTS} and world["network"] == "Socket"
    # 2.28.9 logs 'splitCount N color C key K- Init START' (no space before the dash) and no commId on splits
    assert (child["function"], child["parent"], child["mode"], child["color"]) == (
        "ncclCommSplit", world["comm"], "split", 0)
    assert child["config"] == {"blocking": 1, **HINTS}  # split_group without options: the parent's, copied
    assert child["comm_hash"] is None
    # new_group on an eager world: torch splits the world's communicator with a color of its own
    assert (other["function"], other["parent"], other["config"]) == ("ncclCommSplit", world["comm"], {"blocking": 1})
    assert other["color"] not in (None, 0) and len({world["comm"], child["comm"], other["comm"]}) == 3
    assert {e["device"] for e in (world, child, other)} == {"cuda:0"}
    # destroy_process_group() at the end: 2.28.9 logs '- Destroy COMPLETE' (under INIT), the children first
    gone = [(e["comm"], e["how"]) for e in events if e["kind"] == "comm_destroyed"]
    assert gone == [(child["comm"], "destroy"), (other["comm"], "destroy"), (world["comm"], "destroy")]


def _launches(name: str) -> list[tuple]:
    path = CAPTURED / name
    dump = load_dump(path.read_bytes() if path.suffix == ".pkl" else path.read_text())
    return [(e["group_desc"], e["profiling_name"], e["ops"], e["coalesced"], e["seq"]) for e in launch_events(dump)]


def test_a_coalescing_block_is_one_flight_recorder_entry_in_the_pickle_and_the_json():
    want = [
        ("default_pg", "nccl:all_reduce", 1, False, 1),
        ("default_pg", "nccl:allreduce_coalesced", 2, True, 2),  # _coalescing_manager block of two all_reduce
        ("default_pg", "nccl:allreduce_coalesced", 1, True, 3),  # all_reduce_coalesced of one tensor
        ("captured_split", "nccl:all_reduce", 1, False, 1),
        ("captured_new_group", "nccl:all_reduce", 1, False, 1),
    ]
    assert _launches("fr_nccl_torch2.11_ws1_rank0.pkl") == want
    assert _launches("fr_nccl_torch2.11_ws1_rank0.json") == want


def test_a_destroyed_subgroup_logs_its_communicator_destroy_before_the_world_does():
    """Both worlds (eager: the subgroup is a split of the world's communicator; lazy: a communicator of its
    own) log the subgroup's 'Destroy COMPLETE' between its creation and the world's, as NcclTarget's
    comm_destroyed observation (API-LIFECYCLE's _expect_destroyed) relies on."""
    for mode, split in (("eager", True), ("lazy", False)):
        events = parse_nccl_log_file(CAPTURED / f"nccl_2.28.9_torch2.11_h200_ws1_subgroup_destroy_{mode}.log")
        order = [(e["kind"], e["comm"]) for e in events]
        world, sub = [e for e in events if e["kind"] == "comm_created"]
        assert (sub["parent"] == world["comm"]) is split, mode
        assert order == [("comm_created", world["comm"]), ("comm_created", sub["comm"]),
                         ("comm_destroyed", sub["comm"]), ("comm_destroyed", world["comm"])], mode
