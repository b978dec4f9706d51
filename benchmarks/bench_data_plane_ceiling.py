"""How close any multi-process all_reduce can come to this machine's copy bandwidth: the ceiling behind
bench_data_plane.py's "sim/copy" goal (issue 16: >= 0.7), measured in one run.

Two figures, each against the copy baseline of bench_data_plane.py (a torch copy of the op's n*N output bytes
with every core's threads, 2*n*N bytes / time):
- the floor of one cross-process hand-off: the round trip of one byte over a pipe between two processes;
- an all_reduce (sum, float32, 4 forked ranks, one thread each) that stages nothing: rank r reads every peer's
  chunk r straight from the peer's tensor (process_vm_readv) block by block into cache, adds, and writes the
  result into every rank's tensor (process_vm_writev). That is the minimal traffic bench_data_plane counts
  (each output byte written once and read once), so its ratio is what a design without shared staging could
  reach here. It runs once on tensors in 4 KiB pages (torch's default) and once on tensors whose memory was
  advised to transparent huge pages before first touch (what THP_MEM_ALLOC_ENABLE=1 does in torch).
  Two barriers (multiprocessing.Barrier) per op: peers' inputs ready, every write done.
Each op's result is checked against the exact sum the ranks' inputs give.

Run: .venv/bin/python benchmarks/bench_data_plane_ceiling.py [--sizes 1,4,16,64] [--world 4]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

import multiprocess as mp
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_data_plane import copy_seconds

MIB = 1 << 20
GOAL = 0.7  # issue 16: all_reduce at this fraction of the copy baseline
BLOCK = 1 << 20  # bytes per process_vm call: large enough for few calls, small enough to stay in cache
HUGE = 2 << 20
MADV_HUGEPAGE = 14
PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1).value
_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.restype = _libc.process_vm_writev.restype = ctypes.c_ssize_t


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _vm(call: str, pid: int, local: int, remote: int, nbytes: int) -> None:
    """process_vm_readv/writev of one contiguous range; raise OSError naming the call when it falls short."""
    mine, theirs = _IoVec(local, nbytes), _IoVec(remote, nbytes)
    done = getattr(_libc, call)(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
    if done != nbytes:
        err = ctypes.get_errno()
        raise OSError(err, f"{call} from pid {pid}: {done} of {nbytes} bytes: {os.strerror(err)}")


def _tensor(numel: int, huge: bool) -> torch.Tensor:
    """An untouched float32 tensor, its memory advised to huge pages first when ``huge``."""
    t = torch.empty(numel)
    if huge:
        start = -(-t.data_ptr() // HUGE) * HUGE
        end = (t.data_ptr() + 4 * numel) // HUGE * HUGE
        if end > start:
            _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE)
    return t


def _rank(r: int, world: int, nbytes: int, iters: int, huge: bool, table, barrier, results) -> None:
    try:
        torch.set_num_threads(1)
        _libc.prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)  # where Yama restricts ptrace to ancestors
        t = _tensor(nbytes // 4, huge)
        table[2 * r], table[2 * r + 1] = os.getpid(), t.data_ptr()
        barrier.wait()
        peers = {p: (table[2 * p], table[2 * p + 1]) for p in range(world) if p != r}
        lo, hi = r * nbytes // world, (r + 1) * nbytes // world
        acc, tmp = torch.empty(BLOCK // 4), torch.empty(BLOCK // 4)
        samples, expected = [], world * (world + 1) / 2
        for _ in range(iters + 2):
            t.fill_(float(r + 1))
            barrier.wait()  # every input is in place
            started = time.perf_counter()
            for off in range(lo, hi, BLOCK):
                n = min(BLOCK, hi - off)
                a, b = acc[: n // 4], tmp[: n // 4]
                a.copy_(t[off // 4: (off + n) // 4])
                for pid, base in peers.values():
                    _vm("process_vm_readv", pid, b.data_ptr(), base + off, n)
                    a.add_(b)
                for pid, base in peers.values():
                    _vm("process_vm_writev", pid, a.data_ptr(), base + off, n)
                t[off // 4: (off + n) // 4].copy_(a)
            barrier.wait()  # every write into this rank's tensor is done
            samples.append(time.perf_counter() - started)
            if not bool((t == expected).all()):
                wrong = int((t != expected).sum())
                raise AssertionError(f"rank {r}: {wrong} of {t.numel()} elements differ from {expected}")
        results.put((r, statistics.median(samples[2:]), ""))
    except Exception as exc:  # noqa: BLE001 - reported by the parent, which stops the other ranks
        barrier.abort()
        results.put((r, 0.0, f"{type(exc).__name__}: {exc}"))


def zero_staging_all_reduce(world: int, nbytes: int, iters: int, huge: bool) -> tuple[float, str]:
    """Rank 0's median seconds per op, or (0, why) when process_vm access or the result failed."""
    ctx = mp.get_context("fork")
    table, barrier, results = ctx.Array(ctypes.c_int64, 2 * world, lock=False), ctx.Barrier(world), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, nbytes, iters, huge, table, barrier, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(30)
    errors = [f"rank {r}: {e}" for r, _, e in got if e and "BrokenBarrier" not in e]
    return (0.0, "; ".join(errors)) if errors else (got[0][1], "")


def pipe_round_trip_s(trips: int = 20000) -> float:
    """Median seconds of one byte there and back between two processes over pipes."""
    (r1, w1), (r2, w2) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        for _ in range(trips):
            os.read(r1, 1)
            os.write(w2, b"x")
        os._exit(0)
    samples = []
    for _ in range(trips):
        started = time.perf_counter()
        os.write(w1, b"x")
        os.read(r2, 1)
        samples.append(time.perf_counter() - started)
    os.waitpid(pid, 0)
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16,64", help="MiB per rank, comma-separated")
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    world, mibs = args.world, [int(x) for x in args.sizes.split(",")]
    rtt = pipe_round_trip_s()
    print(f"{world} ranks, float32, {os.cpu_count()} CPU cores, torch {torch.__version__}")
    print(f"pipe round trip between two processes: {rtt * 1e6:.1f} us (median)")
    print(f"{'size':>7} {'copy ms':>8} {f'{GOAL:g} of copy ms':>15} {'4K pages ms':>12} {'ratio':>6} {'THP ms':>8} "
          f"{'ratio':>6} {f'pipe round trips in {GOAL:g} of copy':>32}")
    for m in mibs:
        nbytes, iters = m * MIB, max(5, 64 // m)
        copy_iters = max(5, 256 * MIB // (world * nbytes))
        before = copy_seconds(world * nbytes, copy_iters)
        runs = [zero_staging_all_reduce(world, nbytes, iters, huge) for huge in (False, True)]
        copy_s = min(before, copy_seconds(world * nbytes, copy_iters))  # the stricter baseline, as bench_data_plane
        cells = [f"{t * 1e3:>{w}.2f} {copy_s / t:>6.2f}" if t else f"{'n/a':>{w}} {'':>6}"
                 for (t, _), w in zip(runs, (12, 8))]
        print(f"{m:>3} MiB {copy_s * 1e3:>8.3f} {copy_s / GOAL * 1e3:>15.3f} {cells[0]} {cells[1]} "
              f"{copy_s / GOAL / rtt:>32.1f}")
        for (_, why), pages in zip(runs, ("4K pages", "THP")):
            if why:
                print(f"  {m} MiB, {pages}: not measurable here: {why}")


if __name__ == "__main__":
    main()
