"""Parse an NCCL debug log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS including INIT and ENV).

What it reads (formats of NCCL's src/init.cc and src/debug.cc, 2.18 to 2.30):

- the line prefix ``host:pid:tid [cudaDev] NCCL INFO <message>``, with or without the
  optional timestamp NCCL_DEBUG_TIMESTAMP_FORMAT puts in front;
- ``[<fn>] comm 0x.. rank R nranks N cudaDev D [nvmlDev V] busId B [parent 0x..]
  [splitCount|childCount C] [color X key K] [commId 0x..] - Init START|COMPLETE``:
  one ``comm_created`` event per ``Init COMPLETE`` (a communicator that finished init);
- ``Comm config <Field> set to <value>`` (NCCL_ENV, logged by parseCommConfig for each
  field the caller set, before that communicator's ``Init START``) and
  ``Comm config <field> reset to NCCL_<VAR>=<value>`` (an environment override);
  both are attached to the next communicator that starts init in the file;
- ``Using network <name>``: the network plugin of a communicator. NCCL logs it in
  commAlloc, before that communicator's ``Init START`` (NCCL 2.30.7 src/init.cc:486 in
  commAlloc, called at :1882/:1908 before the START lines at :1886/:1912; 2.28.9
  :428, :1559-1574), from the thread that then logs the START line; it is attached to the
  next ``Init START`` of the same thread.

What it cannot see: fields the caller left unset (NCCL logs only those it was given), the
global ranks of a communicator (NCCL logs rank and nranks only), which torch process group
owns it, and config of a split child created with config NULL (copied from the parent
without logging). With several communicators initialising concurrently in one process the
attribution of config lines is by order in the file and can be wrong. Lines that do not
match (channels, rings, trees, truncated writes) are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from conformance.probe import Event

_PREFIX = re.compile(r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] NCCL INFO (?P<msg>.*)$")
_PTR = r"0x[0-9a-fA-F]+|\(nil\)"
_INIT = re.compile(
    rf"(?:(?P<fn>nccl\w+) )?comm (?P<comm>{_PTR}) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
    r" cudaDev (?P<cuda>-?\d+)(?: nvmlDev -?\d+)? busId (?P<bus>[0-9a-fA-F]+)"
    rf"(?: parent (?P<parent>{_PTR}))?(?: (?:splitCount|childCount) \d+)?"
    r"(?: color (?P<color>-?\d+) key (?P<key>-?\d+))?(?: commId (?P<hash>0x[0-9a-fA-F]+))?"
    r"\s*- Init (?P<phase>START|COMPLETE)\s*$"
)
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


class _State:
    """What is pending between lines: config for the next init, comms started but not complete."""

    def __init__(self) -> None:
        self.pending_config: dict[str, Any] = {}
        self.pending_network: dict[tuple[str, int, int], str] = {}
        self.started: dict[str, dict[str, Any]] = {}
        self.events: list[Event] = []

    def feed(self, msg: str, host: str, pid: int, tid: int) -> None:
        if (m := _CONFIG_SET.match(msg)) or (m := _CONFIG_RESET.match(msg)):
            self.pending_config[_field(m["field"])] = _value(m["value"])
        elif m := _NETWORK.match(msg):
            self.pending_network[(host, pid, tid)] = m["name"]
        elif m := _INIT.search(msg):
            self._init(m, host, pid, tid)

    def _init(self, m: re.Match[str], host: str, pid: int, tid: int) -> None:
        comm = _ptr(m["comm"])
        if comm is None:
            return
        if m["phase"] == "START":
            network = self.pending_network.pop((host, pid, tid), None)
            self.started[comm] = {"config": self.pending_config, "network": network}
            self.pending_config = {}
            return
        begun = self.started.pop(comm, {"config": {}, "network": None})
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
    """``comm_created`` events (see the module docstring) from NCCL debug log lines, in order."""
    state = _State()
    for line in lines:
        m = _PREFIX.search(line.rstrip("\n"))
        if m:
            state.feed(m["msg"], m["host"], int(m["pid"]), int(m["tid"]))
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
