"""The NCCL log reader on real output (tests/gpu/samples/real, copied verbatim from ../shared/real-nccl-logs;
sources in tests/gpu/samples/README.md). Each expectation was written from reading the excerpt, line by
line, not from the parser's output: (pid, comm, rank, nranks, device, commId hash, parent, config, network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.gpu import parse_nccl_log, parse_nccl_log_file

REAL = Path(__file__).parent / "samples" / "real"

E05_HASH = "0x49bbd7790311d5eb"
E07_HASH = "0x56bea185a98d5193"
E11_HASH = "0x3470ca318760efc8"
E13_HASH = "0x8bdef7956b63ef29"
E17_HASH = "0x5ae77eb5ea4ec1ee"
BLOCKING = {"blocking": 1}

# excerpt -> what a reader sees complete, in the order the COMPLETE lines appear
EXPECTED: dict[str, list[tuple]] = {
    # one rank, START only: nothing completed
    "e01_nccl2.18.3_issue1038_single_rank_start.log": [],
    # pid 626's world comm 0x61f44bf0 starts (config Blocking on tid 626, network IB on tid 15081) but its
    # COMPLETE is not in the excerpt; the first line is chopped before its prefix; pid 627's 2-rank comm completes
    "e03_nccl2.21fmt_vllm_ray_prefixed_chopped.log": [
        (627, "0x13184050", 1, 2, "cuda:1", "0xeb2017ca963a5ff3", None, {}, None),
    ],
    # one process, eight GPUs: five COMPLETE lines, the sixth is cut at "NCCL INF"
    "e05_nccl2.22_issue1412_one_proc_8gpu_complete.log": [
        (2017630, "0x8ec0ac0", 6, 16, "cuda:6", E05_HASH, None, {}, None),
        (2017630, "0x8e48640", 4, 16, "cuda:4", E05_HASH, None, {}, None),
        (2017630, "0x8d57d40", 0, 16, "cuda:0", E05_HASH, None, {}, None),
        (2017630, "0x8d93f80", 1, 16, "cuda:1", E05_HASH, None, {}, None),
        (2017630, "0x8e84880", 5, 16, "cuda:5", E05_HASH, None, {}, None),
    ],
    # two processes: each logs "Comm config Blocking set to 1" on its main thread and START/COMPLETE on an init
    # thread; after destroy, both re-init (rank 1 reusing commId 0x56bea185a98d5193) but neither completes here
    "e07_nccl2.26.2_torchrun_lightning_2proc_reinit.log": [
        (10208, "0x58892a1d3910", 0, 2, "cuda:0", E07_HASH, None, BLOCKING, "Socket"),
        (10209, "0x650f74e56d60", 1, 2, "cuda:1", E07_HASH, None, BLOCKING, "Socket"),
    ],
    # four processes split concurrently, each with its own config line (main thread) and network (init thread)
    "e09_nccl2.27.3_deepspeed_4proc_concurrent_split_interleaved.log": [
        (193, "0x55ce48494fa0", 2, 16, "cuda:2", None, "0x55ce46f4ce20", BLOCKING, "Libfabric"),
        (192, "0x563eb875b740", 1, 16, "cuda:1", None, "0x563eb6215af0", BLOCKING, "Libfabric"),
        (191, "0x556ea5a6db80", 0, 16, "cuda:0", None, "0x556ea5166cf0", BLOCKING, "Libfabric"),
        (194, "0x559d9ac13de0", 3, 16, "cuda:3", None, "0x559d9a6ce460", BLOCKING, "Libfabric"),
    ],
    # two hosts, init on the main thread, SUBSYS=INIT,NET (no config lines)
    "e11_nccl2.28.9_nccltests_2node_mpirun_merged.log": [
        (23491, "0xbca552dd2650", 0, 2, "cuda:0", E11_HASH, None, {}, "IB"),
        (24302, "0xc53b8f7f6ab0", 1, 2, "cuda:0", E11_HASH, None, {}, "IB"),
    ],
    # eight processes spliced mid-line: only ranks 2, 7 and 5 have a whole COMPLETE line (7 and 5 after another
    # process's cut fragment); the COMPLETE lines of ranks 4, 3, 6, 0 and 1 are cut by splices. (Rank 7's prefix
    # follows "busId 53" with no space: its host reads "53gpu-dev-597b33eb"; where a splice ends cannot be told.)
    "e13_nccl2.29.7-2.30.3_torch_inference_8proc_spliced_lines.log": [
        (1797, "0x558cfd9a5110", 2, 8, "cuda:2", E13_HASH, None, {}, None),
        (1802, "0x557c7b4cc730", 7, 8, "cuda:7", E13_HASH, None, {}, None),
        (1800, "0x560e57de0270", 5, 8, "cuda:5", E13_HASH, None, {}, None),
    ],
    # the old format: no function, no nvmlDev, no commId; two hosts, several GPUs per process
    "e15_nccl2.7-2.8_issue629_old_format_no_commId.log": [
        (193027, "0x7fdf08000d00", 15, 16, "cuda:7", None, None, {}, None),
        (193027, "0x7fdf04000d00", 14, 16, "cuda:6", None, None, {}, None),
        (193027, "0x7fdf18000d00", 12, 16, "cuda:4", None, None, {}, None),
        (193027, "0x7fdf24000d00", 8, 16, "cuda:0", None, None, {}, None),
        (193027, "0x7fdf1c000d00", 9, 16, "cuda:1", None, None, {}, None),
        (58077, "0x7f30b0000d00", 2, 16, "cuda:2", None, None, {}, None),
        (58077, "0x7f30a4000d00", 5, 16, "cuda:5", None, None, {}, None),
        (58077, "0x7f30a8000d00", 4, 16, "cuda:4", None, None, {}, None),
    ],
    # four COMPLETE lines, the fifth (rank 33) cut after "nvmlDev"
    "e17_nccl2.19-2.20fmt_issue1814_64rank_multinode.log": [
        (984, "0x557fe785f7a0", 36, 64, "cuda:4", E17_HASH, None, {}, None),
        (982, "0x560dfc7a10e0", 34, 64, "cuda:2", E17_HASH, None, {}, None),
        (980, "0x55986b8b8560", 32, 64, "cuda:0", E17_HASH, None, {}, None),
        (983, "0x55f01c18e490", 35, 64, "cuda:3", E17_HASH, None, {}, None),
    ],
}


def _seen(events: list[dict]) -> list[tuple]:
    return [(e["pid"], e["comm"], e["rank"], e["nranks"], e["device"], e["comm_hash"], e["parent"], e["config"],
             e["network"]) for e in events if e["kind"] == "comm_created"]


def test_every_real_excerpt_is_covered():
    assert sorted(EXPECTED) == sorted(p.name for p in REAL.glob("*.log"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_excerpt_parses_into_the_communicators_a_reader_sees(name):
    assert _seen(parse_nccl_log_file(REAL / name)) == EXPECTED[name]


def _lines(name: str) -> list[str]:
    return (REAL / name).read_text().splitlines()


def test_splits_and_functions_of_real_lines():
    e09 = parse_nccl_log_file(REAL / "e09_nccl2.27.3_deepspeed_4proc_concurrent_split_interleaved.log")
    assert {(e["mode"], e["function"], e["color"]) for e in e09} == {("split", "ncclCommSplit", 1734919490)}
    e15 = parse_nccl_log_file(REAL / "e15_nccl2.7-2.8_issue629_old_format_no_commId.log")
    assert {e["host"] for e in e15} == {"A03-R28-I49-3-9000018", "A03-R28-I49-2-6000166"}
    assert {e["function"] for e in e15} == {None}


def _one_process(lines: list[str], pid: str, values: dict[str, str]) -> list[str]:
    """e09's lines as if one process (pid ``pid``) ran the four splits, each caller thread's config value
    replaced by ``values[tid]`` so that a misattributed batch shows."""
    out = []
    for line in lines:
        host, _, rest = line.partition(":")
        old_pid, _, rest = rest.partition(":")
        tid = rest.split(" ", 1)[0]
        if not old_pid.isdigit():
            continue
        moved = f"{host}:{pid}:{rest}"
        if "Comm config Blocking" in moved:
            moved = moved.replace("set to 1", f"set to {values[tid]}")
        out.append(moved)
    return out


def test_config_goes_to_the_init_of_its_device_when_inits_overlap_in_one_process():
    # Constructed from e09 (real lines; pids made one, the Blocking values made distinct per caller): four inits
    # overlap in one process; each caller thread logs its config on its device, each START comes later on an
    # init thread of that device, in another order (devices 3, 1, 0, 2) than the config lines (1, 0, 3, 2).
    lines = _one_process(_lines("e09_nccl2.27.3_deepspeed_4proc_concurrent_split_interleaved.log"), "191",
                         {"192": "11", "191": "10", "194": "13", "193": "12"})
    events = parse_nccl_log(lines)
    assert {e["device"]: e["config"] for e in events} == {
        "cuda:0": {"blocking": 10}, "cuda:1": {"blocking": 11}, "cuda:2": {"blocking": 12}, "cuda:3": {"blocking": 13},
    }


def test_network_logged_after_start_goes_to_that_communicator():
    # e07's rank 0 with its "Using network" line moved after START (NCCL 2.18 to the 2.31.0 dev branch log it
    # before; the reader takes either order): the network is still that communicator's.
    lines = [ln for ln in _lines("e07_nccl2.26.2_torchrun_lightning_2proc_reinit.log") if ":10208:" in ln]
    net = next(i for i, ln in enumerate(lines) if "Using network" in ln)
    start = next(i for i, ln in enumerate(lines) if "Init START" in ln)
    moved = lines[:net] + lines[net + 1:start + 1] + [lines[net].replace("Socket", "IB")] + lines[start + 1:]
    event, gone = parse_nccl_log(moved)
    assert (event["comm"], event["network"]) == ("0x58892a1d3910", "IB")
    assert (gone["kind"], gone["comm"]) == ("comm_destroyed", event["comm"])


def test_destroy_and_abort_lines_are_read_in_every_format_and_only_complete_ones():
    # e07 (NCCL 2.26.2, real): both ranks' communicators logged '- Destroy COMPLETE' before torch re-inits
    e07 = parse_nccl_log_file(REAL / "e07_nccl2.26.2_torchrun_lightning_2proc_reinit.log")
    gone = [(e["pid"], e["comm"], e["rank"], e["nranks"], e["how"]) for e in e07 if e["kind"] == "comm_destroyed"]
    assert gone == [(10209, "0x650f74e56d60", 1, 2, "destroy"), (10208, "0x58892a1d3910", 0, 2, "destroy")]
    created = [e["comm"] for e in e07 if e["kind"] == "comm_created"]
    assert {c for _, c, *_ in gone} <= set(created)
    # the format NCCL 2.18.3 to 2.30.7 write (src/init.cc '%s COMPLETE', abort ? "Abort" : "Destroy"); an
    # 'Abort START' (2.28.9 :2510) or a cut line is no destruction
    lines = ["h:7:7 [2] NCCL INFO comm 0x5a rank 3 nranks 4 cudaDev 2 busId 1b000 - Abort COMPLETE",
             "h:7:7 [2] NCCL INFO comm 0x5b rank 3 nRanks 4 cudaDev 2 busId 1b000 - Abort START",
             "h:7:7 [2] NCCL INFO comm 0x5c rank 3 nranks 4 cudaDev 2 busId 1b000 - Destroy COMPL"]
    assert [(e["comm"], e["how"], e["device"]) for e in parse_nccl_log(lines)] == [("0x5a", "abort", "cuda:2")]
