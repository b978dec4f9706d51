"""Multi-process tests of the simulator's shared-memory data plane (simulator.fabric.Fabric)."""

from __future__ import annotations

import ctypes
import datetime
import hashlib
import os
import signal
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simulator.fabric
from simulator import shm
from simulator.errors import CollectiveMismatch, P2PMismatch, RankTimeout, SimError
from simulator.fabric import Fabric
from simulator.reduction import REDUCE_OPS, unsupported
from tests.forked import fork_and_collect

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.complex64]
TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2), torch.float32: (1e-5, 1e-5),
       torch.complex64: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}
LARGE_BYTES = 1 << 18  # tests lower the chunk-per-rank threshold of all_reduce / reduce to this

Body = Callable[[Fabric, int, int], Any]


# ------------------------------------------------------------------ harness
def _child(ports: Any, n: int, rank: int, prefix: str, timeout_s: float, fn: Body, q: Any) -> None:
    try:
        torch.set_num_threads(1)  # 4+ ranks on 2 cores: spinning intra-op threads would starve peers
        client = dist.TCPStore("127.0.0.1", ports.get(timeout=30), is_master=False,
                               timeout=datetime.timedelta(seconds=30))
        fab = Fabric(dist.PrefixStore("fab", client), "c0", list(range(n)), rank, timeout_s, prefix)
        # Connect this thread's store clone and line everyone up before the body runs, so that a slow
        # TCP connect (seen on these sandboxes: 1 s + 5 s now and then) cannot trip short op timeouts.
        fab.control.store()
        if client.add("ready", 1) == n:
            client.set("go", "1")
        client.wait(["go"])
        try:
            out = fn(fab, rank, n)
        finally:
            fab.close()
        q.put((rank, "ok", out))
    except BaseException as exc:  # reported to the parent, which asserts on it
        q.put((rank, "err", (type(exc).__name__, str(exc))))


def run_ranks(n: int, fn: Body, prefix: str, *, timeout_s: float = 10.0, deadline_s: float = 40.0,
              on_start: Callable[[list[Any]], None] | None = None) -> dict[int, tuple[str, Any]]:
    """Run fn(fabric, rank, n) in n forked processes; return {rank: ("ok", value) | ("err", (type, msg))}."""
    results, _ = fork_and_collect(n, _child, lambda r, ports, q: (ports, n, r, prefix, timeout_s, fn, q),
                                  deadline_s=deadline_s, on_start=on_start)
    return results


def ok_values(results: dict[int, tuple[str, Any]], n: int) -> list[Any]:
    assert sorted(results) == list(range(n)), f"ranks missing from results: {results}"
    errs = {r: v for r, (s, v) in results.items() if s != "ok"}
    assert not errs, f"ranks failed: {errs}"
    return [results[r][1] for r in range(n)]


@pytest.fixture
def prefix(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(simulator.fabric, "_SPLIT_BYTES", LARGE_BYTES)  # inherited by forked ranks
    monkeypatch.setattr(simulator.fabric, "_block_bytes", lambda n: 4096)  # chunks reduced in many blocks
    name = f"fabtest{os.getpid()}_{zlib.crc32(request.node.nodeid.encode()):08x}_"
    yield name
    left = [f for f in os.listdir(shm.SHM_DIR) if f.startswith(name)]
    shm.sweep(name)
    assert not left, f"segments left in /dev/shm: {left}"


# ---------------------------------------------------------------- test data
def gen(rank: int, dtype: torch.dtype, numel: int, salt: str, small: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{rank}/{salt}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if dtype.is_complex:
        return torch.randn(numel, generator=g, dtype=torch.complex128).to(dtype)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)
    lo, hi = (1, 3) if small else ((0, 10) if dtype == torch.uint8 else (-10, 10))
    return torch.randint(lo, hi, (numel,), generator=g).to(dtype)


def reference(ts: list[torch.Tensor], op: str) -> torch.Tensor:
    dtype = ts[0].dtype
    if dtype == torch.bool:
        x = torch.stack(ts)
        return x.any(0) if op in ("sum", "max") else x.all(0)
    x = torch.stack([t.to(torch.complex128 if dtype.is_complex else torch.float64) for t in ts])
    r = {"sum": lambda: x.sum(0), "avg": lambda: x.mean(0), "product": lambda: x.prod(0),
         "min": lambda: x.amin(0), "max": lambda: x.amax(0)}[op]()
    return r.to(dtype)


def mismatch(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    rtol, atol = TOL.get(expected.dtype, (0, 0))
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as exc:
        return str(exc)[:300]
    return None


def digest(t: torch.Tensor) -> str:
    t = t.contiguous()
    return hashlib.sha1(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())).hexdigest()


# ------------------------------------------------------------- the matrix
def matrix(fab: Fabric, rank: int, n: int) -> dict[str, Any]:
    """Every op x dtype x (small, chunked) size against a float64 reference computed on this rank."""
    fails: list[str] = []
    digests: dict[str, str] = {}

    def check(key: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
        if (why := mismatch(actual, expected)) is not None:
            fails.append(f"{key}: {why}")

    for dtype in DTYPES:
        esize = torch.empty(0, dtype=dtype).element_size()
        for numel in (12 * n, (LARGE_BYTES // esize // n + 3) * n):
            tag = f"{dtype}/{numel}"
            for op in REDUCE_OPS:
                small = op == "product"
                ins = [gen(r, dtype, numel, f"{tag}/{op}", small) for r in range(n)]
                why = unsupported(dtype, op)
                t = ins[rank].clone()
                try:
                    fab.all_reduce([t], op)
                except SimError as exc:
                    if why is None or "rejected" not in str(exc):
                        fails.append(f"all_reduce {tag} {op}: unexpected {exc}")
                    continue
                if why is not None:
                    fails.append(f"all_reduce {tag} {op}: expected rejection ({why})")
                    continue
                expected = reference(ins, op)
                check(f"all_reduce {tag} {op}", t, expected)
                digests[f"all_reduce {tag} {op}"] = digest(t)
                root = (numel + len(op)) % n
                t = ins[rank].clone()
                fab.reduce([t], root, op)
                check(f"reduce {tag} {op}", t, expected if rank == root else ins[rank])
                out = torch.empty(numel // n, dtype=dtype)
                fab.reduce_scatter_tensor([out], [ins[rank]], op)
                m = numel // n
                check(f"reduce_scatter {tag} {op}", out, expected[rank * m:(rank + 1) * m])
            ins = [gen(r, dtype, numel, f"{tag}/gather") for r in range(n)]
            outs = [torch.empty(numel, dtype=dtype) for _ in range(n)]
            fab.all_gather(outs, ins[rank])
            for r in range(n):
                check(f"all_gather {tag} from {r}", outs[r], ins[r])
            big = torch.empty(n * numel, dtype=dtype)
            fab.all_gather_into_tensor([big], [ins[rank]])
            check(f"all_gather_into_tensor {tag}", big, torch.cat(ins))
            digests[f"all_gather_into_tensor {tag}"] = digest(big)
            t = ins[rank].clone()
            fab.broadcast([t], n - 1)
            check(f"broadcast {tag}", t, ins[n - 1])
            a2a = torch.empty(numel, dtype=dtype)
            fab.all_to_all_single(a2a, ins[rank], None, None)
            m = numel // n
            check(f"all_to_all {tag}", a2a, torch.cat([ins[r][rank * m:(rank + 1) * m] for r in range(n)]))
    return {"fails": fails, "digests": digests}


def coalesced(fab: Fabric, rank: int, n: int) -> list[str]:
    """Coalesced lists mixing dtypes and sizes, including the chunked path, in one exchange each."""
    fails = []
    shapes = [(5,), (3, 70000), (0,), (2, 2)]
    dts = [torch.float32, torch.float32, torch.float32, torch.int64]
    specs = list(enumerate(zip(shapes, dts, strict=True)))
    ins = [[gen(r, dt, torch.Size(s).numel(), f"co{i}").view(s) for i, (s, dt) in specs] for r in range(n)]
    seq0 = fab.seq
    ts = [x.clone() for x in ins[rank]]
    fab.all_reduce(ts, "sum")
    for i, t in enumerate(ts):
        if (why := mismatch(t, reference([ins[r][i] for r in range(n)], "sum"))) is not None:
            fails.append(f"all_reduce[{i}]: {why}")
    outs = [torch.empty((n * s[0], *s[1:]), dtype=dt) for s, dt in zip(shapes, dts, strict=True)]
    fab.all_gather_into_tensor(outs, ins[rank])
    for i, o in enumerate(outs):
        if (why := mismatch(o, torch.cat([ins[r][i] for r in range(n)]))) is not None:
            fails.append(f"all_gather_into_tensor[{i}]: {why}")
    ts = [x.clone() for x in ins[rank]]
    fab.broadcast(ts, 0)
    fails += [f"broadcast[{i}]" for i, t in enumerate(ts) if not torch.equal(t, ins[0][i])]
    rs_in = [gen(rank, torch.float64, 4 * n, "rs0"), gen(rank, torch.float32, 70000 * n, "rs1")]
    rs_out = [torch.empty(4), torch.empty(70000)]
    rs_out[0] = rs_out[0].double()
    fab.reduce_scatter_tensor(rs_out, rs_in, "max")
    for i, (o, size) in enumerate(zip(rs_out, (4, 70000), strict=True)):
        full = reference([gen(r, o.dtype, size * n, f"rs{i}") for r in range(n)], "max")
        if (why := mismatch(o, full[rank * size:(rank + 1) * size])) is not None:
            fails.append(f"reduce_scatter[{i}]: {why}")
    if fab.seq != seq0 + 4:
        fails.append(f"seq advanced by {fab.seq - seq0}, expected 4 (one per coalesced call)")
    return fails


@pytest.mark.parametrize("n", [2, 4])
def test_every_op_and_dtype_matches_float64_reference(n: int, prefix: str) -> None:
    values = ok_values(run_ranks(n, matrix, prefix), n)
    for r, v in enumerate(values):
        assert not v["fails"], f"rank {r}: {v['fails'][:5]}"
    for key, d in values[0]["digests"].items():
        assert all(v["digests"][key] == d for v in values), f"{key}: results differ bitwise across ranks"


def test_coalesced_lists(prefix: str) -> None:
    for r, fails in enumerate(ok_values(run_ranks(3, coalesced, prefix), 3)):
        assert not fails, f"rank {r}: {fails}"


def test_eight_ranks(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> list[str]:
        fails = []
        for dtype, numel in ((torch.float32, 100), (torch.float32, 80000), (torch.int64, 40000)):
            ins = [gen(r, dtype, numel, f"w8{numel}") for r in range(n)]
            t = ins[rank].clone()
            fab.all_reduce([t], "sum")
            if (why := mismatch(t, reference(ins, "sum"))) is not None:
                fails.append(why)
            outs = [torch.empty(numel, dtype=dtype) for _ in range(n)]
            fab.all_gather(outs, ins[rank])
            fails += [f"all_gather from {r}" for r in range(n) if not torch.equal(outs[r], ins[r])]
        fab.barrier()
        return fails

    for r, fails in enumerate(ok_values(run_ranks(8, body, prefix), 8)):
        assert not fails, f"rank {r}: {fails}"


def test_all_to_all_single_uneven_splits(prefix: str) -> None:
    n = 4
    splits = [[0, 3, 1, 2], [2, 2, 0, 5], [1, 0, 0, 0], [4, 1, 3, 0]]  # splits[i][j]: rows i -> j

    def body(fab: Fabric, rank: int, n: int) -> list[bool]:
        ins = [gen(r, torch.float32, sum(splits[r]) * 3, "a2a").view(-1, 3) for r in range(n)]
        out_sizes = [splits[i][rank] for i in range(n)]
        out = torch.empty(sum(out_sizes), 3)
        fab.all_to_all_single(out, ins[rank], out_sizes, splits[rank])
        pieces = [ins[i][sum(splits[i][:rank]):sum(splits[i][:rank + 1])] for i in range(n)]
        return [torch.equal(out, torch.cat(pieces))]

    assert ok_values(run_ranks(n, body, prefix), n) == [[True]] * n


def test_all_gather_of_uneven_tensors(prefix: str) -> None:
    """Member j gathers j + 1 elements from member j (ProcessGroupNCCL's uneven all_gather); a member whose own
    output is not the size of its input is refused on every member."""
    n = 3

    def body(fab: Fabric, rank: int, n: int) -> list[Any]:
        ins = [gen(r, torch.float32, r + 1, "uneven") for r in range(n)]
        outs = [torch.full((j + 1,), -1.0) for j in range(n)]
        fab.all_gather(outs, ins[rank])
        exact = [torch.equal(o, i) for o, i in zip(outs, ins, strict=True)]
        wrong = [torch.zeros(2) for _ in range(n)]  # every member names size 2 for member 0's 1 element
        try:
            fab.all_gather(wrong, ins[rank])
            refused = "no error"
        except SimError as exc:
            refused = str(exc)
        return [exact, "rank 0" in refused and "float32[1]" in refused]

    assert ok_values(run_ranks(n, body, prefix), n) == [[[True] * n, True]] * n


def test_all_to_all_split_disagreement_raises_everywhere(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> None:
        out_sizes = [1, 1] if rank == 0 else [2, 1]  # rank 1 expects 2 rows from rank 0, which sends 1
        fab.all_to_all_single(torch.empty(sum(out_sizes)), torch.ones(2), out_sizes, [1, 1])

    results = run_ranks(2, body, prefix)
    for r in range(2):
        status, (kind, msg) = results[r]
        assert (status, kind) == ("err", "CollectiveMismatch")
        assert "rank 0 sends 1 rows to rank 1, which expects 2" in msg


MISMATCHES: dict[str, Callable[[Fabric, int], None]] = {
    "op": lambda f, r: f.all_reduce([torch.ones(4)], "sum") if r == 0 else f.all_gather(
        [torch.empty(4), torch.empty(4)], torch.ones(4)),
    "dtype": lambda f, r: f.all_reduce([torch.ones(4, dtype=(torch.float32, torch.float64)[r])], "sum"),
    "shape": lambda f, r: f.all_reduce([torch.ones(4 + r)], "sum"),
    "reduce_op": lambda f, r: f.all_reduce([torch.ones(4)], "sum" if r == 0 else "max"),
    "root": lambda f, r: f.broadcast([torch.ones(4)], r),
}


@pytest.mark.parametrize("kind", [*MISMATCHES, "order"])
def test_collective_mismatch_raises_on_every_rank_naming_both(kind: str, prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> tuple[str, str, bool]:
        if kind == "order":  # rank 0 issues broadcast then barrier, rank 1 barrier then broadcast
            first: Callable[[], None] = ((lambda: fab.broadcast([torch.ones(4)], 0)) if rank == 0
                                         else fab.barrier)
        else:
            def first() -> None:
                MISMATCHES[kind](fab, rank)
        try:
            first()
        except CollectiveMismatch as exc:
            caught = ("CollectiveMismatch", str(exc))
        else:
            caught = ("none", "")
        t = torch.full((3,), float(rank + 1))
        fab.all_reduce([t], "sum")  # the communicator stays usable after a mismatch
        return caught[0], caught[1], bool(torch.equal(t, torch.full((3,), 3.0)))

    for r, (name, msg, usable) in enumerate(ok_values(run_ranks(2, body, prefix), 2)):
        assert name == "CollectiveMismatch", f"rank {r} did not raise"
        assert "comm c0 seq 1" in msg and "rank 0:" in msg and "rank 1:" in msg, msg
        assert usable


def test_mismatch_message_format(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> str:
        with pytest.raises(CollectiveMismatch) as info:
            MISMATCHES["op"](fab, rank)
        return str(info.value)

    msgs = ok_values(run_ranks(2, body, prefix), 2)
    expected = ("comm c0 seq 1: ranks issued different collectives: rank 0: all_reduce(float32[4], sum); "
                "rank 1: all_gather(float32[4])")
    assert msgs == [expected, expected]


def test_rank_timeout_names_absent_rank(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> None:
        if rank != 2:
            fab.all_reduce([torch.ones(4)], "sum")

    results = run_ranks(3, body, prefix, timeout_s=1.0)
    assert results[2][0] == "ok"
    for r in (0, 1):
        status, (kind, msg) = results[r]
        assert (status, kind) == ("err", "RankTimeout"), results[r]
        assert "comm c0 seq 1" in msg and "all_reduce" in msg and "rank(s) 2 did not arrive" in msg, msg


def test_unsupported_reduce_rejected_on_every_rank(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> str:
        with pytest.raises(SimError) as info:
            fab.all_reduce([torch.ones(4, dtype=torch.int32)], "avg")
        return str(info.value)

    for msg in ok_values(run_ranks(2, body, prefix), 2):
        assert "avg is not supported for int32" in msg and "rank 0" in msg and "rank 1" in msg


def test_p2p_tags_out_of_order_and_zero_size(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> list[bool]:
        if rank == 0:
            for tag in (1, 2, 3, 2):
                fab.send(torch.full((tag + 1,), float(10 * tag)), 1, tag)
            fab.send(torch.empty(0), 1, 9)
            return []
        got = []
        for tag in (3, 2, 1, 2):  # the second tag-2 message is taken after the first one
            t = torch.empty(tag + 1)
            assert fab.recv(t, 0, tag) == 0
            got.append(bool(torch.equal(t, torch.full((tag + 1,), float(10 * tag)))))
        got.append(fab.recv(torch.empty(0), 0, 9) == 0)
        return got

    assert ok_values(run_ranks(2, body, prefix), 2)[1] == [True] * 5


def test_recv_any_source(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> list[int]:
        if rank:
            fab.send(torch.full((3,), float(rank)), 0, 5 if rank != 2 else 6)
            return []
        got = []
        t = torch.empty(3)
        got.append(fab.recv(t, None, 6))
        assert torch.equal(t, torch.full((3,), 2.0))
        for _ in range(2):
            src = fab.recv(t, None, 5)
            assert torch.equal(t, torch.full((3,), float(src)))
            got.append(src)
        return got

    first, *rest = ok_values(run_ranks(4, body, prefix), 4)[0]
    assert first == 2 and sorted(rest) == [1, 3]


def test_non_contiguous_views(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> list[str]:
        fails = []
        base = torch.arange(48, dtype=torch.float32).view(6, 8) * (rank + 1)
        t = base.clone().t()  # 8x6, non-contiguous
        fab.all_reduce([t], "sum")
        fails += [] if torch.equal(t, (base.t() / (rank + 1)) * 3) else ["all_reduce"]
        outs = [torch.zeros(6, 8)[:, ::2] for _ in range(n)]
        fab.all_gather(outs, base[:, ::2].t().t())
        mine = base / (rank + 1)
        fails += [f"all_gather {r}" for r in range(n) if not torch.equal(outs[r], mine[:, ::2] * (r + 1))]
        big = torch.zeros(12, 16)[:, ::2]
        fab.all_gather_into_tensor([big], [base])
        fails += [] if torch.equal(big, torch.cat([mine * (r + 1) for r in range(n)])) else ["agit"]
        rs_in = [torch.arange(32.0).view(8, 4) * (r + 1) for r in range(n)]
        rs = torch.zeros(4, 8)[:, ::2]
        fab.reduce_scatter_tensor([rs], [rs_in[rank].t()], "sum")
        want = sum(x.t().reshape(-1)[rank * 16:(rank + 1) * 16] for x in rs_in).view(4, 4)
        fails += [] if torch.equal(rs, want) else ["reduce_scatter"]
        a2a_in = [(torch.arange(24.0).view(4, 6) * (r + 1))[:, ::2] for r in range(n)]
        a2a = torch.zeros(4, 6)[:, ::2]
        fab.all_to_all_single(a2a, a2a_in[rank], None, None)
        fails += [] if torch.equal(a2a, torch.cat([x[rank * 2:rank * 2 + 2] for x in a2a_in])) else ["a2a"]
        bc = torch.full((6, 8), float(rank))[:, ::2]
        fab.broadcast([bc], 1)
        fails += [] if torch.equal(bc, torch.ones(6, 4)) else ["broadcast"]
        if rank == 0:
            fab.send(base.t(), 1, 0)
        else:
            recv = torch.zeros(8, 12)[:, ::2]
            fab.recv(recv, 0, 0)
            fails += [] if torch.equal(recv, (base / (rank + 1)).t()) else ["p2p"]
        return fails

    assert ok_values(run_ranks(2, body, prefix), 2) == [[], []]


def test_chunked_reductions_of_views_and_repeated_tensors(prefix: str) -> None:
    """The chunked path reads a rank's own chunk in place; a non-contiguous tensor, a tensor listed twice
    and two views of one storage must still reduce every rank's original values."""
    def body(fab: Fabric, rank: int, n: int) -> list[str]:
        numel = LARGE_BYTES // 4 * 2
        mine = torch.arange(numel, dtype=torch.float32) % 1000 + rank
        want = sum(torch.arange(numel, dtype=torch.float32) % 1000 + r for r in range(n))
        fails = []
        wide = torch.zeros(numel, 2)
        wide[:, 0] = mine
        column = wide[:, 0]  # non-contiguous, chunked
        fab.all_reduce([column], "sum")
        fails += [] if torch.equal(column, want) and not wide[:, 1].any() else ["non-contiguous"]
        t = mine.clone()
        fab.all_reduce([t, t], "sum")
        fails += [] if torch.equal(t, want) else [f"listed twice: {t[:4].tolist()} != {want[:4].tolist()}"]
        both = torch.cat([mine, mine])
        fab.all_reduce([both[:numel], both[numel:]], "sum")
        fails += [] if torch.equal(both, torch.cat([want, want])) else ["two views of one storage"]
        t = mine.clone()
        fab.reduce([t], n - 1, "sum")
        fails += [] if torch.equal(t, want if rank == n - 1 else mine) else ["reduce"]
        return fails

    assert ok_values(run_ranks(3, body, prefix), 3) == [[], [], []]


def test_p2p_size_mismatch_reported_to_both_sides(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> str:
        if rank == 0:
            fab.send(torch.ones(4), 1, 7)
            fab.barrier()  # the receiver has seen the message
            with pytest.warns(RuntimeWarning) as seen:
                fab.send(torch.full((4,), 2.0), 1, 8)  # the next send is delivered, the rejection reported
            return str(seen[0].message)
        with pytest.raises(P2PMismatch) as info:
            fab.recv(torch.empty(8), 0, 7)
        fab.barrier()
        after = torch.empty(4)
        fab.recv(after, 0, 8)
        assert torch.equal(after, torch.full((4,), 2.0))
        return str(info.value)

    sender, receiver = ok_values(run_ranks(2, body, prefix), 2)
    assert "rank 1" in receiver and "rank 0" in receiver and "tag=7" in receiver
    assert "expected float32[8]" in receiver and "observed float32[4]" in receiver
    assert "rejected by the receiver" in sender and "expected float32[8]" in sender


def test_p2p_from_concurrent_threads(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> bool:
        def ping(peer: int, out: list[bool]) -> None:
            t = torch.empty(1000)
            for i in range(20):
                if rank == 0:
                    fab.send(torch.full((1000,), float(i * 10 + peer)), peer, i)
                    fab.recv(t, peer, i)
                else:
                    fab.recv(t, 0, i)
                    fab.send(t * 2, 0, i)
                want = float(i * 10 + peer) * (2 if rank == 0 else 1)
                out.append(bool(torch.equal(t, torch.full((1000,), want))))

        if rank:
            res: list[bool] = []
            ping(rank, res)
            return all(res)
        outs: list[list[bool]] = [[], []]
        threads = [threading.Thread(target=ping, args=(p, outs[p - 1])) for p in (1, 2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=20)
        return all(outs[0]) and all(outs[1]) and len(outs[0]) == len(outs[1]) == 20

    assert ok_values(run_ranks(3, body, prefix), 3) == [True] * 3


def test_recv_timeout_names_source(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> str:
        if rank == 1:
            with pytest.raises(RankTimeout) as info:
                fab.recv(torch.empty(2), 0, 3)
            return str(info.value)
        return ""

    msg = ok_values(run_ranks(2, body, prefix, timeout_s=0.5), 2)[1]
    assert "recv(tag=3) on rank 1" in msg and "from rank 0" in msg and "comm c0" in msg


def test_sigkill_mid_run_leaves_no_segment(prefix: str) -> None:
    """A rank killed with a send never received leaves nothing in /dev/shm: a message's bytes live in a memfd
    of the sender's, with no name (before, its segment stayed until someone swept the prefix)."""
    def body(fab: Fabric, rank: int, n: int) -> None:
        if rank == 1:
            fab.send(torch.ones(1 << 16), 0, 99)  # never received
        while True:
            fab.all_reduce([torch.ones(1 << 17)], "sum")

    def killer(procs: list[Any]) -> None:
        time.sleep(1.5)  # the send is posted and a few all_reduces ran
        os.kill(procs[1].pid, signal.SIGKILL)

    control = f"{prefix}control"  # the probe below sees a segment with this prefix when there is one
    shm.create(control, 8)
    assert [f for f in os.listdir(shm.SHM_DIR) if f.startswith(prefix)] == [control]
    shm.unlink(control)
    results = run_ranks(2, body, prefix, timeout_s=1.0, deadline_s=20, on_start=killer)
    assert results[0][0] == "err" and results[0][1][0] == "RankTimeout", results
    assert "rank(s) 1 did not arrive" in results[0][1][1]
    assert 1 not in results
    left = [f for f in os.listdir(shm.SHM_DIR) if f.startswith(prefix)]
    assert not left, f"segments left in /dev/shm after every rank ended: {left}"


def test_sweep_refuses_empty_prefix() -> None:
    with pytest.raises(ValueError):
        shm.sweep("")


def test_no_segment_outlives_its_op(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> list[str]:
        fab.all_reduce([torch.ones(1 << 20)], "sum")
        fab.all_gather([torch.empty(10) for _ in range(n)], torch.ones(10))
        if rank == 0:
            fab.send(torch.ones(10), 1, 0)
        elif rank == 1:
            fab.recv(torch.empty(10), 0, 0)
        fab.barrier()
        return [f for f in os.listdir(shm.SHM_DIR) if f.startswith(prefix)]

    assert ok_values(run_ranks(3, body, prefix), 3) == [[], [], []]


def test_small_payloads_ride_inline_and_large_ones_in_slots(prefix: str) -> None:
    def body(fab: Fabric, rank: int, n: int) -> list[object]:
        small = torch.full((4,), float(rank + 1))
        fab.all_reduce([small], "sum")
        after_small = fab.slots.segment
        large = torch.full((1 << 16,), float(rank + 1))
        fab.all_reduce([large], "sum")
        return [after_small, fab.slots.segment is not None, small.tolist(), bool((large == 6.0).all())]

    for rank, (seg, has_seg, small, large_ok) in enumerate(ok_values(run_ranks(3, body, prefix), 3)):
        assert seg is None, f"rank {rank}: a 16-byte all_reduce created segment {seg}"
        assert has_seg, f"rank {rank}: a 256 KiB all_reduce created no segment"
        assert small == [6.0] * 4 and large_ok, f"rank {rank}: wrong sums {small}, large ok={large_ok}"
