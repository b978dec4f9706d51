"""Parse an NCCL debug log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS including INIT, ENV and, from NCCL 2.30, DESTROY)
into ``comm_created`` events, each communicator that completed init with the config fields and network it
logged, and ``comm_destroyed`` events, each communicator whose destroy or abort completed.

The formats read (NCCL 2.7 to 2.31) and how config lines are tied to their communicator: conformance/targets/
README.md ("Reading NCCL's debug log"). It cannot see fields the caller left unset, a communicator's global
ranks, the torch group that owns it, a split child's config copied without logging, or lines cut by a splice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.probe import Event

_HEAD = re.compile(r"(?P<host>[^\s:()]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] NCCL INFO ")
_PTR = r"0x[0-9a-fA-F]+|\(nil\)"
_INIT = re.compile(
    rf"(?:(?P<fn>nccl\w+) )?comm (?P<comm>{_PTR}) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
    r" cudaDev (?P<cuda>-?\d+)(?: nvmlDev -?\d+)? busId (?P<bus>[0-9a-fA-F]+)"
    rf"(?: parent (?P<parent>{_PTR}))?(?: (?:splitCount|childCount) \d+)?"
    r"(?: color (?P<color>-?\d+) key (?P<key>-?\d+))?(?: commId (?P<hash>0x[0-9a-fA-F]+))?"
    r"\s*- Init (?P<phase>START|COMPLETE)\s*$"
)
# "- Destroy COMPLETE" / "- Abort COMPLETE" once commFree is done: logged under INIT up to 2.29.7, under
# DESTROY from 2.30.3 (NCCL src/init.cc: v2.18.3 :1948/:1980, v2.28.9 :333, v2.29.7 :357, v2.30.3 :376).
_GONE = re.compile(
    rf"^comm (?P<comm>{_PTR}) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cuda>-?\d+)"
    r" busId [0-9a-fA-F]+ - (?P<how>Destroy|Abort) COMPLETE\s*$", re.IGNORECASE)
_CONFIG_SET = re.compile(r"^Comm config (?P<field>[A-Za-z][\w ]*?) set to (?P<value>\S*)\s*$")
_CONFIG_RESET = re.compile(r"^Comm config (?P<field>\w+) reset to (?P<env>NCCL_\w+)=(?P<value>\S*)\s*$")
_NETWORK = re.compile(r"^Using network (?P<name>\S+)\s*$")

# NCCL's spellings of config fields (parseCommConfig's labels and ncclConfig_t members)
# mapped to the names ProcessGroupNCCL.Options uses.
_FIELDS = {
    "blocking": "blocking",
    "cga cluster size": "cga_cluster_size",
    "cgaclustersize": "cga_cluster_size",
    "min ctas": "min_ctas",
    "minctas": "min_ctas",
    "max ctas": "max_ctas",
    "maxctas": "max_ctas",
    "net name": "net_name",
    "netname": "net_name",
    "split share": "split_share",
    "splitshare": "split_share",
    "comm name": "comm_name",
    "commname": "comm_name",
}


def _field(label: str) -> str:
    key = label.strip().lower()
    return _FIELDS.get(key, key.replace(" ", "_"))


def _value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def _ptr(text: str | None) -> str | None:
    return None if text in (None, "(nil)") else text.lower()


@dataclass
class _Batch:
    """The config lines one init call logged: its thread, its device, the fields (and how each was logged)."""

    tid: int
    dev: int
    config: dict[str, Any] = field(default_factory=dict)
    logged: set[tuple[str, str]] = field(default_factory=set)
    taken: bool = False


@dataclass
class _Process:
    """What is pending in one process between lines."""

    batches: list[_Batch] = field(default_factory=list)
    network: dict[int, str] = field(default_factory=dict)  # by tid, logged before that thread's START
    started: dict[str, dict[str, Any]] = field(default_factory=dict)  # by comm pointer
    no_network: dict[int, str] = field(default_factory=dict)  # tid -> its open comm that logged no network

    def config(self, tid: int, dev: int, how: str, name: str, value: Any) -> None:
        mine = [b for b in self.batches if b.tid == tid and not b.taken]
        batch = mine[-1] if mine and (how, name) not in mine[-1].logged else None
        if batch is None:
            batch = _Batch(tid, dev)
            self.batches.append(batch)
        batch.config[name] = value
        batch.logged.add((how, name))

    def take_config(self, dev: int) -> dict[str, Any]:
        waiting = [b for b in self.batches if not b.taken]
        batch = next((b for b in waiting if b.dev == dev), waiting[0] if waiting else None)
        if batch is None:
            return {}
        batch.taken = True
        self.batches = [b for b in self.batches if not b.taken]
        return batch.config

    def using_network(self, tid: int, name: str) -> None:
        comm = self.no_network.pop(tid, None)
        if comm in self.started:
            self.started[comm]["network"] = name
        else:
            self.network[tid] = name


class _State:
    """Pending state per process (host, pid), and the events made so far."""

    def __init__(self) -> None:
        self.processes: dict[tuple[str, int], _Process] = {}
        self.events: list[Event] = []

    def feed(self, msg: str, host: str, pid: int, tid: int, dev: int) -> None:
        proc = self.processes.setdefault((host, pid), _Process())
        if m := _CONFIG_SET.match(msg):
            proc.config(tid, dev, "set", _field(m["field"]), _value(m["value"]))
        elif m := _CONFIG_RESET.match(msg):
            proc.config(tid, dev, "reset", _field(m["field"]), _value(m["value"]))
        elif m := _NETWORK.match(msg):
            proc.using_network(tid, m["name"])
        elif m := _INIT.search(msg):
            self._init(proc, m, host, pid, tid)
        elif (m := _GONE.match(msg)) and (comm := _ptr(m["comm"])):
            self.events.append({"kind": "comm_destroyed", "comm": comm, "how": m["how"].lower(),
                                "rank": int(m["rank"]), "nranks": int(m["nranks"]), "device": f"cuda:{m['cuda']}",
                                "host": host, "pid": pid, "tid": tid})

    def _init(self, proc: _Process, m: re.Match[str], host: str, pid: int, tid: int) -> None:
        comm = _ptr(m["comm"])
        if comm is None:
            return
        if m["phase"] == "START":
            network = proc.network.pop(tid, None)
            proc.started[comm] = {"config": proc.take_config(int(m["cuda"])), "network": network}
            if network is None:
                proc.no_network[tid] = comm
            return
        begun = proc.started.pop(comm, {"config": {}, "network": None})
        parent = _ptr(m["parent"])
        self.events.append({
            "kind": "comm_created",
            "comm": comm,
            "group": None,
            "members": None,
            "parent": parent,
            "mode": "split" if parent else None,
            "device": f"cuda:{m['cuda']}",
            "config": begun["config"],
            "backend": "nccl",
            "rank": int(m["rank"]),
            "nranks": int(m["nranks"]),
            "comm_hash": m["hash"].lower() if m["hash"] and int(m["hash"], 16) else None,
            "function": m["fn"],
            "color": int(m["color"]) if m["color"] is not None else None,
            "network": begun["network"],
            "host": host,
            "pid": pid,
            "tid": tid,
        })


def expand_debug_file(pattern: str, hostname: str, pid: int) -> str:
    """The file NCCL writes for NCCL_DEBUG_FILE=``pattern`` in process ``pid`` on ``hostname``: ``%h`` is
    the host name up to its first dot with '%' and '/' made '-', ``%p`` the pid, ``%%`` a '%', any other
    ``%x`` kept (NCCL 2.30.7 src/debug.cc:113-129, :201-233; src/misc/utils.cc:73-82)."""
    host = hostname.split(".", 1)[0].replace("%", "-").replace("/", "-")
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        nxt = pattern[i + 1] if i + 1 < len(pattern) else ""
        if ch != "%" or not nxt:
            out.append(ch)
            i += 1
            continue
        out.append({"%": "%", "h": host, "p": str(pid)}.get(nxt, "%" + nxt))
        i += 2
    return "".join(out)


def parse_nccl_log(lines: Iterable[str]) -> list[Event]:
    """``comm_created`` and ``comm_destroyed`` events from NCCL debug log lines, in order
    (conformance/targets/README.md, "Reading NCCL's debug log")."""
    state = _State()
    for line in lines:
        heads = list(_HEAD.finditer(line.rstrip("\n")))
        if heads:
            head = heads[-1]
            state.feed(head.string[head.end():], head["host"], int(head["pid"]), int(head["tid"]), int(head["dev"]))
    return state.events


def parse_nccl_log_file(path: str | Path, offset: int = 0) -> list[Event]:
    """Parse the log at ``path`` from byte ``offset``; a missing file has no events."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return []
    return parse_nccl_log(data.decode("utf-8", errors="replace").splitlines())
