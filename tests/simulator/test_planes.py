"""The fabric's typed wire records, the store-connection pool and the control plane's exchange, in one process."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from simulator import connections
from simulator.control import ControlPlane
from simulator.errors import RankTimeout
from simulator.mailbox import META_BYTES
from simulator.payload import from_text, layout, pack, to_text, typed
from simulator.wire import Envelope, OpMeta, Splits, envelope_key, phase_key, rejected_key


def test_op_meta_round_trips_with_splits() -> None:
    meta = OpMeta("all_to_all(float32)", None, "seg.s1", 65536, Splits([[2, 3], [1, 3]], [[2, 3], [4, 3]], [24, 12]))
    back = OpMeta.decode(meta.encode())
    assert back == meta
    assert isinstance(back.splits, Splits)
    bare = OpMeta("barrier()", "root 5 is out of range for 2 ranks", None, 0)
    assert OpMeta.decode(bare.encode()) == bare


def test_inline_payload_round_trips_bit_exactly() -> None:
    a, b = torch.tensor([1.5, -0.0, float("nan")]), torch.arange(5, dtype=torch.int64) - 2**40
    offs, total = layout([a, b])
    meta = OpMeta("all_reduce(float32[3], int64[5], sum)", None, None, 0, inline=to_text(pack([a, b], offs, total)))
    back = OpMeta.decode(meta.encode())
    assert back == meta
    buf = from_text(back.inline)
    assert buf.numel() == total
    assert typed(buf, offs[0], a.dtype, 3).view(torch.int32).tolist() == a.view(torch.int32).tolist()
    assert torch.equal(typed(buf, offs[1], b.dtype, 5), b)


def test_envelope_round_trips_and_names_its_tensor() -> None:
    env = Envelope(3, 7, "bfloat16", [2, 4], "seg.p1.3")
    assert Envelope.decode(env.encode()) == env
    assert env.describe() == "bfloat16[2,4]"
    assert Envelope(0, 0, "float32", [0]).segment is None


def test_keys_of_different_records_never_collide() -> None:
    keys = {phase_key("meta", 1, 0), phase_key("reduced", 1, 0), phase_key("meta", 1, 1),
            envelope_key(0, 1, 0), envelope_key(1, 0, 0), rejected_key(0, 1)}
    assert len(keys) == 6


def _acquire_in_threads(root: dist.Store, count: int) -> list[dist.Store]:
    """``count`` threads each acquire a connection, all held at once, then hand them back."""
    got: list[dist.Store] = []
    lock, ready = threading.Lock(), threading.Barrier(count)

    def body() -> None:
        conn = connections.acquire(root)
        with lock:
            got.append(conn)
        ready.wait(timeout=60)
        connections.release_thread()

    threads = [threading.Thread(target=body) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    return got


@pytest.mark.parametrize("max_idle, reopened", [(4, 2), (connections.MAX_IDLE, 0)])
def test_connections_of_ended_threads_are_reused(max_idle: int, reopened: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second wave of as many threads opens no connection: lazy P2P has one stream thread per peer, and a
    connect can stall for seconds. With 4 kept idle (the old limit), 2 of 6 are opened again (the control)."""
    monkeypatch.setattr(connections, "MAX_IDLE", max_idle)
    server = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    root = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    first = _acquire_in_threads(root, 6)
    second = _acquire_in_threads(root, 6)
    assert len({id(c) for c in first}) == 6
    new = [c for c in second if all(c is not f for f in first)]
    assert len(new) == reopened, f"second wave opened {len(new)} connections, expected {reopened}"


def _planes(own_connection: bool, timeout_s: float = 0.5) -> Callable[[int], ControlPlane]:
    """A maker of rank ``r``'s control plane of a 3-rank communicator on one store (ranks as planes in one process)."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    prefixes = ("ns/", "comm/c0/")

    def plane(rank: int) -> ControlPlane:
        base = dist.PrefixStore(prefixes[1], dist.PrefixStore(prefixes[0], server))
        return ControlPlane(base, "c0", [0, 1, 2], rank, timeout_s, root=server if own_connection else None,
                            prefixes=prefixes if own_connection else ())
    return plane


@pytest.mark.parametrize("own_connection", [True, False])
def test_exchange_timeout_names_the_absent_rank(own_connection: bool) -> None:
    """Rank 2 absent twice: it never created the communicator (no mailbox in the store), then it has one but
    posts nothing for the op; each time the timeout names it alone, and once it posts the exchange completes."""
    plane = _planes(own_connection)
    ctl, one = plane(0), plane(1)
    assert one.mailbox is not None
    one.mailbox.post("meta", 1, b"from rank 1")
    expected = r"Timed out waiting 500ms for all_reduce on rank 0: rank\(s\) 2 did not arrive \(arrived: 0, 1\)"
    with pytest.raises(RankTimeout, match=expected):
        ctl.exchange(1, "meta", "mine", to=range(3), frm=range(3), what="all_reduce")
    assert ctl.broken
    two = plane(2)
    assert two.mailbox is not None
    one.mailbox.post("meta", 2, b"one")
    with pytest.raises(RankTimeout, match=expected):
        ctl.exchange(2, "meta", "mine", to=range(3), frm=range(3), what="all_reduce")
    two.mailbox.post("meta", 2, b"two")
    ctl.broken = None
    assert ctl.exchange(2, "meta", "mine", to=range(3), frm=range(3), what="all_reduce") == {1: "one", 2: "two"}


def test_exchange_wakes_the_waiter_and_spills_a_large_message_to_the_store() -> None:
    """Three ranks exchange at once, from threads: rank 1's message is larger than a mailbox region, so it goes
    through the store (its key exists while the op is current); the others' through the mailboxes."""
    plane = _planes(True, timeout_s=10.0)
    ctls = [plane(r) for r in range(3)]
    bodies = ["zero", "x" * (META_BYTES + 1), "two"]
    got: dict[int, dict[int, str]] = {}

    def run(r: int) -> None:
        got[r] = ctls[r].exchange(1, "meta", bodies[r], to=range(3), frm=range(3), what="all_reduce")

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert got == {r: {j: bodies[j] for j in range(3) if j != r} for r in range(3)}
    assert ctls[0].store().check([phase_key("meta", 1, 1)]), "the large message did not go through the store"
    assert not ctls[0].store().check([phase_key("meta", 1, 0)]), "a small message went through the store"
