"""P2P-EAGER-REUSE judged on real-format NCCL output: the check itself runs on two forked CPU ranks over gloo,
and the NCCL probe (conformance.targets.nccl.NcclProbe) reads, in place of the GPU's, an NCCL log and a flight
recorder dump in the formats a real run writes: e07's lines (NCCL 2.26.2, tests/gpu/samples/real) and entries of
the real dump f01's shape. The NCCL side is replayed as the run goes: the world communicator's lines are logged
while init_process_group runs (eager), the flight recorder gains the barrier, and, once the check's own send/recv
reached torch's dispatcher (seen by the launches probe), the P2P entries and, in the lazy recording, the 2-rank
communicator ProcessGroupNCCL made for the pair.

The eager recording must pass and the lazy one fail; before launch events from the flight recorder named their
group, the eager one failed too ("communicators carrying P2P under eager init ... observed ['0']")."""

from __future__ import annotations

import copy
import re
import traceback
from pathlib import Path
from typing import Any

import torch.distributed as dist

from conformance.checks.registry import CheckContext, load_checks
from conformance.gpu import load_dump
from conformance.outcomes import CheckFailed, NotObservable
from conformance.probes.launches import LaunchProbe
from conformance.spec import load_catalog
from conformance.targets.base import Driver
from conformance.targets.gloo import GlooTarget
from conformance.targets.nccl import NcclProbe
from tests.forked import fork_and_collect

REAL = Path(__file__).parent / "samples" / "real"
E07 = REAL / "e07_nccl2.26.2_torchrun_lightning_2proc_reinit.log"
PIDS = ("10208", "10209")  # e07's rank 0 and rank 1


def world_lines(rank: int) -> list[str]:
    """Rank ``rank``'s lines of e07 up to its world communicator's Init COMPLETE (real, verbatim)."""
    mine = [ln for ln in E07.read_text().splitlines() if re.match(rf"[^:]+:{PIDS[rank]}:", ln)]
    end = next(i for i, ln in enumerate(mine) if "Init COMPLETE" in ln)
    return mine[:end + 1]


def world_pointer(rank: int) -> str:
    return re.search(r"comm (0x[0-9a-f]+)", world_lines(rank)[-1])[1]


def pair_lines(rank: int) -> list[str]:
    """The 2-rank comm a lazy run makes for P2P: e07's re-init START line of this rank, with the commId both
    ranks log for one communicator (e07's rank 1 logged a stale one: the bug that log reports), and its
    COMPLETE line in 2.26.2's format (COMPLETE is START's line without "[Rank r] ", v2.26.2 src/init.cc)."""
    start = next(ln for ln in E07.read_text().splitlines()
                 if re.match(rf"[^:]+:{PIDS[rank]}:", ln) and "Init START" in ln and world_pointer(rank) not in ln)
    start = re.sub(r"commId 0x[0-9a-f]+", "commId 0x139a27671bffc886", start)
    return [start, start.replace("Init START", "Init COMPLETE")]


def fr_entry(record_id: int, name: str, p2p_seq: int, is_p2p: bool) -> dict[str, Any]:
    """An entry of the real dump f01's shape (its frames dropped) with another op."""
    text = (REAL / "f01_fr_pytorch_tutorial_test_short_pickle_v2.5.txt").read_text()
    entry = copy.deepcopy(load_dump(re.sub(r'\("([^"]*)", "([^"]*)"\)', r'["\1", "\2"]', text))["entries"][0])
    entry.update(record_id=record_id, profiling_name=name, p2p_seq_id=p2p_seq, is_p2p=is_p2p, frames=[])
    return entry


class Replay:
    """The NCCL side of one rank's recorded run, replayed as the check goes (module doc)."""

    def __init__(self, rank: int, log: Path, lazy: bool) -> None:
        self.rank, self.log, self.lazy = rank, log, lazy
        self.launches = LaunchProbe().start()
        self.phase = "before init"

    def world_made(self) -> None:
        self.phase = "initialised"
        with self.log.open("a") as fh:
            fh.write("\n".join(world_lines(self.rank)) + "\n")

    def sync(self) -> None:
        p2p = any(e["op"] in ("send", "recv") for e in self.launches.events("launch"))
        if self.phase == "initialised" and p2p:
            self.phase = "after p2p"
            if self.lazy:
                with self.log.open("a") as fh:
                    fh.write("\n".join(pair_lines(self.rank)) + "\n")

    def dump(self) -> dict[str, Any]:
        entries = [] if self.phase == "before init" else [fr_entry(0, "nccl:all_reduce_barrier", 0, False)]
        if self.phase == "after p2p":
            peer = 1 - self.rank
            names = [f"nccl:send {self.rank}->{peer}", f"nccl:recv {self.rank}<-{peer}"] * 3
            entries += [fr_entry(i + 1, name, i + 1, True) for i, name in enumerate(names)]
        return {"version": "2.5", "pg_config": {}, "pg_status": {}, "entries": entries}

    def groups(self) -> dict[str, tuple[str, list[int]]]:
        """What _comm_groups() gives on the GPU: the world group's communicator pointer -> ("0", members)."""
        return {world_pointer(self.rank): ("0", [0, 1])} if self.phase != "before init" else {}


class RecordedNcclTarget(GlooTarget):
    """gloo, standing in for NCCL's eagerly bound worlds: the recording replayed is of a bound world."""

    features = GlooTarget.features | {"device_binding"}


class RecordedNcclDriver(Driver):
    """gloo worlds (for the check's real traffic), the NCCL probe reading the replayed recording."""

    def __init__(self, target: RecordedNcclTarget, replay: Replay) -> None:
        super().__init__(target)
        self.replay = replay
        self._nccl: NcclProbe | None = None

    def own_probe(self) -> NcclProbe:
        self._nccl = NcclProbe(self.replay.log, dump=self.replay.dump, groups=self.replay.groups)
        return self._nccl

    def probe(self) -> Any:
        self.replay.sync()
        return super().probe()

    def init_world(self, store: dist.Store, rank: int, world_size: int, spec: Any, timeout_s: float) -> Any:
        world = self._init_default_group(store, rank, world_size, spec, timeout_s)
        self.replay.world_made()  # eager: NCCL made the world's communicator while init_process_group ran
        assert self._nccl is not None
        self._nccl.world_initialised(store, rank)
        return world


def _rank(rank: int, lazy: bool, tmp: str, ports: Any, q: Any) -> None:
    try:
        store = dist.TCPStore("127.0.0.1", ports.get(timeout=30), is_master=False)
        req = next(r for r in load_catalog() if r.id == "P2P-EAGER-REUSE")
        replay = Replay(rank, Path(tmp) / f"rank{rank}.log", lazy)
        driver = RecordedNcclDriver(RecordedNcclTarget(), replay)
        driver.setup(rank, 2)
        ctx = CheckContext(rank, 2, driver, dist.PrefixStore("run/", store), req, 30.0)
        try:
            load_checks()["P2P-EAGER-REUSE"](ctx)
            q.put((rank, "pass", ""))
        except (CheckFailed, NotObservable) as exc:
            q.put((rank, type(exc).__name__, str(exc)))
        finally:
            driver.teardown()
            replay.launches.close()
    except BaseException:  # reported to the test
        q.put((rank, "error", traceback.format_exc()[-2000:]))


def judge(lazy: bool, tmp_path: Path) -> dict[int, tuple[str, str]]:
    results, _ = fork_and_collect(2, _rank, lambda r, ports, q: (r, lazy, str(tmp_path), ports, q), deadline_s=90)
    assert sorted(results) == [0, 1], results
    return results


def test_eager_recording_passes(tmp_path):
    assert judge(False, tmp_path) == {0: ("pass", ""), 1: ("pass", "")}


def test_lazy_recording_fails_naming_the_pair_communicator(tmp_path):
    results = judge(True, tmp_path)
    for rank, (outcome, detail) in results.items():
        assert outcome == "CheckFailed", (rank, outcome, detail)
        pointer = re.search(r"comm (0x[0-9a-f]+)", pair_lines(rank)[0])[1]
        assert f"communicators created by P2P under eager init: expected 'none', observed [('{pointer}'" in detail
