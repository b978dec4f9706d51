"""Turn a torch flight-recorder dump into ``launch`` events (a coalescing block is one launch of its ops).

The dump's format and how launches and communicators are named: conformance/targets/README.md ("Reading torch's
flight recorder"). It cannot see which NCCL communicator ran an op, the stream, entries the ring buffer
overwrote, or gloo's coalesced blocks (recorded as one plain entry).
"""

from __future__ import annotations

import json
import pickle
from typing import Any

from conformance.probe import Event

# Recorder op names (after the "<backend>:" prefix) -> the probe's op names (those of
# conformance.probes.launches.PY_METHODS). The names ProcessGroupNCCL and c10d's FlightRecorderHook
# record: torch's own analyser lists them (torch/distributed/flight_recorder/components/types.py,
# COLLECTIVES and P2P: v2.13.0 :206-237, v2.15.0 :202-243, which adds "allgather_coalesced"), and
# v2.15.0's libtorch_cuda.so holds the "nccl:" titles of ProcessGroupNCCL (strings: _all_gather_base,
# _broadcast_oop, _reduce_oop, _reduce_scatter_base, all_gather, all_gather_into_tensor_coalesced,
# all_reduce, all_reduce_barrier, all_to_all, allreduce_coalesced, broadcast, coalesced, gather,
# gather_single, recv, reduce, reduce_scatter, reduce_scatter_tensor_coalesced, scatter, send).
# ProcessGroupNCCL runs barrier as an all_reduce titled "all_reduce_barrier": it is a barrier launch.
_OPS = {
    "all_reduce": "allreduce",
    "allreduce": "allreduce",
    "allreduce_coalesced": "allreduce",
    "all_gather": "allgather",
    "allgather": "allgather",
    "all_gather_single": "allgather",
    "all_gather_v": "allgather",
    "_all_gather_base": "allgather",
    "_allgather_base": "allgather",
    "all_gather_into_tensor": "allgather",
    "all_gather_into_tensor_coalesced": "allgather",
    "allgather_coalesced": "allgather",
    "ALLGATHER_coalesced": "allgather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_v": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "REDUCE_SCATTER_coalesced": "reduce_scatter",
    "all_to_all": "alltoall",
    "all_to_all_base": "alltoall",
    "all_to_all_single": "alltoall",
    "all_to_all_v_single": "alltoall",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "gather": "gather",
    "gather_single": "gather",
    "scatter": "scatter",
    "all_reduce_barrier": "barrier",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
}
# Recorded entries that are no launch: a communicator split and a window registration (c10d's
# FlightRecorderHook records them among the collectives, types.py COLLECTIVES above).
_NOT_LAUNCHES = frozenset({"split", "new_window"})


def load_dump(data: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """A dump as a dict, from pickle bytes, JSON bytes or text, or an already loaded dict."""
    if isinstance(data, dict):
        return data
    # Pickle protocol 2+ starts with 0x80; the rank's own torch produced these bytes.
    loaded = pickle.loads(data) if isinstance(data, bytes) and data[:1] == b"\x80" else json.loads(data)
    if not isinstance(loaded, dict) or ("entries" not in loaded and "version" not in loaded):
        raise ValueError("not a flight-recorder dump: expected a dict with 'version' and 'entries'")
    return loaded


def _split_name(profiling_name: str) -> tuple[str | None, str]:
    backend, sep, rest = profiling_name.partition(":")
    if not sep:
        return None, profiling_name.split(" ", maxsplit=1)[0]
    return backend, rest.split(" ", maxsplit=1)[0]


def _op(raw: str) -> str:
    """The probe's name of a recorded op; a name not in ``_OPS`` (a newer torch's) is kept as recorded."""
    return _OPS.get(raw, raw)


def _is_p2p(entry: dict[str, Any], raw: str) -> bool:
    if "is_p2p" in entry:
        return bool(entry["is_p2p"])
    return raw in ("send", "recv")


def _group(entry: dict[str, Any]) -> tuple[str | None, str | None]:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) == 2:
        return str(pg[0]), str(pg[1])
    return None, None


def _block_members(entries: list[dict[str, Any]], end: int, claimed: dict[int, int]) -> list[int]:
    """Indices of the entries the "coalesced" entry at ``end`` closes, nearest first.

    The block is the run of entries of the same process group just before ``end``, of one kind:
    the entry right before ``end`` decides whether it is a P2P batch (then its members share that
    entry's p2p_seq_id) or a collective block (members share the closing entry's
    collective_seq_id). Deciding by that entry, not by the closing one, matters: the closing
    entry of a P2P batch need not be marked p2p, and its collective_seq_id can equal that of the
    collective recorded before the batch, which then must not join the block.
    """
    terminator = entries[end]
    group = _group(terminator)[0]
    members: list[int] = []
    kind: tuple[bool, Any] | None = None
    for j in range(end - 1, -1, -1):
        entry = entries[j]
        raw = _split_name(entry["profiling_name"])[1]
        if j in claimed or raw == "coalesced" or _group(entry)[0] != group:
            break
        p2p = _is_p2p(entry, raw)
        if kind is None:
            kind = (True, entry.get("p2p_seq_id")) if p2p else (False, terminator.get("collective_seq_id"))
        if kind != (p2p, entry.get("p2p_seq_id") if p2p else entry.get("collective_seq_id")):
            break
        members.append(j)
    return members


def _block_op(members: list[str]) -> str:
    if not members:
        return "coalesced"
    if len(set(members)) == 1:
        return members[0]
    return "sendrecv" if set(members) <= {"send", "recv"} else "mixed"


def _valid(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("profiling_name"), str) and (
        _group(entry)[0] is not None
    )


def _launch(entry: dict[str, Any], op: str, ops: int, coalesced: bool, backend: str | None) -> Event:
    name, desc = _group(entry)
    return {
        "kind": "launch",
        "comm": name,
        "group": name,
        "group_desc": desc,
        "op": op,
        "ops": ops,
        "stream": None,
        "device": None,
        "backend": backend,
        "coalesced": coalesced,
        "seq": entry.get("collective_seq_id"),
        "p2p_seq": entry.get("p2p_seq_id"),
        "record_id": entry.get("record_id"),
        "state": entry.get("state"),
        "profiling_name": entry["profiling_name"],
    }


def launch_events(dump: dict[str, Any], after_record_id: int = -1) -> list[Event]:
    """``launch`` events of the entries whose record_id exceeds ``after_record_id``, in record order.

    Malformed entries (no profiling_name, no process_group) are skipped.
    """
    entries = [e for e in dump.get("entries", []) if _valid(e)]
    member_of: dict[int, int] = {}
    for i, entry in enumerate(entries):
        if _split_name(entry["profiling_name"])[1] == "coalesced":
            member_of.update(dict.fromkeys(_block_members(entries, i, member_of), i))
    events: list[Event] = []
    for i, entry in enumerate(entries):
        record_id = entry.get("record_id", i)
        if i in member_of or (isinstance(record_id, int) and record_id <= after_record_id):
            continue
        backend, raw = _split_name(entry["profiling_name"])
        if raw in _NOT_LAUNCHES:
            continue
        if raw == "coalesced":
            names = [entries[j]["profiling_name"] for j in sorted(member_of) if member_of[j] == i]
            members = [_op(_split_name(n)[1]) for n in names]
            events.append(_launch(entry, _block_op(members), len(members), True, backend))
        elif raw.endswith("_coalesced"):
            events.append(_launch(entry, _op(raw), len(entry.get("input_sizes") or []), True, backend))
        else:
            events.append(_launch(entry, _op(raw), 1, False, backend))
    return events
