"""What the GPU leads of issue 12 changed in checks and targets, tested without a GPU."""

from __future__ import annotations

import pytest

from conformance.checks.hints import OPTIONS


def test_hint_net_name_is_the_net_every_host_has():
    # NCCL with config netName tries only the net plugin of that name and fails init when it cannot
    # start it (NCCL 2.30.7 src/plugin/net.cc:330-349); only the built-in Socket plugin starts on
    # every host (src/transport/net_socket.cc:804). "IB" failed on hosts without InfiniBand.
    assert OPTIONS["net_name"] == "Socket"


# ProcessGroupNCCL's lazy-P2P warning as c10's default handler prints it to stderr: the line layout of
# a user's log (lightning, torch 2.x: "[rank0]:[W701 ...ProcessGroupNCCL.cpp:4025] Warning: ... (function
# operator())"), the message text of torch 2.15.0's libtorch_cuda.so. Constructed, not captured.
NCCL_LAZY_LINE = ("[rank0]:[W1121 12:00:00.000000000 ProcessGroupNCCL.cpp:4025] Warning: [PG ID 0 PG GUID 0(default_pg)"
                  " Rank 0] An unbatched P2P op (send/recv) was called on this ProcessGroup with size 4.  In lazy "
                  "initialization mode, this will result in a new 2-rank NCCL communicator to be created. "
                  "(function operator())")


def test_lazy_warning_is_read_from_fd_2_with_the_targets_words():
    import os

    from conformance.checks.p2p import is_lazy_p2p_warning, stderr_lines
    from conformance.targets.nccl import NcclTarget
    from simulator.backend import LAZY_P2P_WARNING

    with stderr_lines(True) as lines:
        os.write(2, (NCCL_LAZY_LINE + "\nunrelated\n").encode())
    assert lines == [NCCL_LAZY_LINE, "unrelated"]
    with stderr_lines(False) as none:
        pass
    assert none == []
    words = NcclTarget.traits.lazy_p2p_warning
    assert NcclTarget.traits.warnings_on_stderr
    assert [is_lazy_p2p_warning(m, words) for m in lines] == [True, False]
    assert not is_lazy_p2p_warning(NCCL_LAZY_LINE, None)  # the generic matcher missed NCCL's text
    assert is_lazy_p2p_warning(LAZY_P2P_WARNING, None)


class _Pools:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def get(self, world_size, start_method=None):
        self.calls.append("get")
        return self

    def fresh(self, world_size, start_method=None):
        self.calls.append(f"fresh:{start_method}")
        return self

    def on_kill(self, name, cleanup):
        pass

    def run(self, task, kwargs, timeout_s, failed=None):
        from conformance.runner.pool import RankReport
        self.calls.append("run")
        return [RankReport(0, "ok", {"rank": 0, "outcome": "pass", "detail": "", "notes": []})]

    def close(self):
        self.calls.append("close")


def _requirement(rid: str):
    from conformance.session import load_bound_catalog
    return next(r for r in load_bound_catalog() if r.id == rid)


def test_checks_a_gpu_target_names_run_in_a_pool_of_their_own(monkeypatch):
    from conformance.runner import orchestrate

    monkeypatch.setattr(orchestrate, "precheck", lambda *_args: None)
    for rid in ("P2P-LAZY-WARN-ONCE", "P2P-MISMATCH"):
        pools = _Pools()
        orchestrate.run_case(pools, _requirement(rid), "nccl", 2)
        assert pools.calls == ["fresh:spawn", "run", "close"]
    pools = _Pools()
    orchestrate.run_case(pools, _requirement("P2P-DATA"), "nccl", 2)
    assert pools.calls == ["get", "run"]


def test_requirements_of_another_design_skip_with_the_reason(monkeypatch):
    from conformance.outcomes import Outcome
    from conformance.runner.orchestrate import precheck
    from conformance.targets import nccl, torchcomms

    """The spec's skip_stacks, for the stack each GPU target runs: torchcomms, and nccl2 where 'nccl' builds it."""
    monkeypatch.setattr(torchcomms.TorchcommsTarget, "unavailable_reason", lambda self, world_size=1: None)
    monkeypatch.setattr(nccl.NcclTarget, "unavailable_reason", lambda self, world_size=1: None)
    for rid in ("P2P-LAZY-PAIR-COMM", "P2P-LAZY-WARN-ONCE", "SPLIT-UNBOUND-REFUSED"):
        outcome, detail = precheck(_requirement(rid), "torchcomms", None, 2)
        assert outcome is Outcome.SKIP and "does not apply on stack torchcomms" in detail, detail
    for rid in ("P2P-LAZY-PAIR-COMM", "P2P-LAZY-WARN-ONCE", "SPLIT-NEWGROUP-NONMEMBERS"):
        monkeypatch.setattr(nccl, "default_stack", lambda: "nccl2")
        outcome, detail = precheck(_requirement(rid), "nccl", None, 2)
        assert outcome is Outcome.SKIP and "does not apply on stack nccl2" in detail, detail
        monkeypatch.setattr(nccl, "default_stack", lambda: "nccl-legacy")
        decided = precheck(_requirement(rid), "nccl", None, 2)
        assert decided is None or "does not apply" not in decided[1], decided


def test_nccl_refusal_wording_is_accepted():
    from types import SimpleNamespace

    from conformance.checks.common import refusal_words
    from conformance.targets.nccl import NcclTarget
    from conformance.targets.sim import SimTarget

    ctx = SimpleNamespace(target=NcclTarget().driver())
    # Constructed: torch appends NCCL's last error; the texts of NCCL 2.30.7 src/init.cc:2320, 2328 and of
    # ProcessGroupNCCL's P2P tensor check (torch 2.15.0 libtorch_cuda.so).
    last = "NCCL error: invalid argument\nLast error:\n"
    refusals = {
        "cga_cluster_size": last + "Invalid config cgaClusterSize attribute value -1",
        "min_ctas": last + "Invalid config min/max channels attribute value 8/4",
        "non-contiguous P2P": "Tensors for P2P must be non-overlapping and dense",
    }
    generic = {"cga_cluster_size": "cga_cluster_size", "min_ctas": "min_ctas", "non-contiguous P2P": "contiguous"}
    for kind, text in refusals.items():
        assert generic[kind] not in text  # what the checks looked for alone: a false FAIL on NCCL
        assert any(w in text for w in refusal_words(ctx, kind, generic[kind])), kind
    assert refusal_words(SimpleNamespace(target=SimTarget().driver()), "min_ctas", "min_ctas") == ("min_ctas",)


class _StreamOrderedWork:
    """Like WorkNCCL for a receive the device never completes: wait() returns at once (it only orders
    streams), wait(timeout) blocks the host and raises."""

    def wait(self, timeout=None):
        if timeout is not None:
            raise RuntimeError(f"WorkNCCL(OpType=RECV) ran for {timeout.total_seconds() * 1000:g} milliseconds "
                               "before timing out")
        return True


def test_p2p_mismatch_waits_with_the_targets_timeout(monkeypatch):
    from types import SimpleNamespace

    import torch

    from conformance.checks import p2p
    from conformance.outcomes import CheckFailed

    monkeypatch.setattr(p2p.dist, "irecv", lambda *_a, **_k: _StreamOrderedWork())
    notes: list[str] = []

    def ctx_for(target):
        return SimpleNamespace(rank=1, world_size=2, device=torch.device("cpu"), target=target,
                               init_world=lambda mode: None, note=notes.append)

    from conformance.targets.base import Traits

    hanging_stack = SimpleNamespace(name="nccl", capabilities=frozenset({"device_binding"}),
                                    traits=Traits(p2p_wait_timeout_s=0.5))
    p2p.mismatch(ctx_for(hanging_stack))  # the recv raised: a refusal, not silent success
    assert notes and "only the size case" in notes[-1]
    plain = SimpleNamespace(name="plain", capabilities=frozenset(), traits=Traits())
    with pytest.raises(CheckFailed, match="observed success"):
        p2p.mismatch(ctx_for(plain))  # without the timeout the same work looks complete


def test_nccl_debug_file_patterns_are_expanded_as_nccl_does(tmp_path, monkeypatch):
    import os
    import socket

    from conformance.gpu.nccl_log import expand_debug_file
    from conformance.targets import nccl

    assert expand_debug_file("/x/%h.%p.%%.%q.log%", "node-1.cluster/a", 42) == "/x/node-1.42.%.%q.log%"
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl.%h.%p.log"))
    for var in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "TORCH_FR_BUFFER_SIZE"):  # setup() sets them: restore after
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(nccl, "flight_recorder_usable", lambda: False)
    target = nccl.NcclTarget().driver()
    target.setup(0, 1)
    host = socket.gethostname().split(".")[0]
    assert target._nccl._log_path == tmp_path / f"nccl.{host}.{os.getpid()}.log"


def test_p2p_eager_reuse_needs_a_probe_that_sees_the_world_comm(monkeypatch):
    from types import SimpleNamespace

    from conformance.checks import p2p
    from conformance.outcomes import NotObservable

    monkeypatch.setattr(p2p.dist, "barrier", lambda *_a, **_k: None)
    monkeypatch.setattr(p2p, "_exchange", lambda *_a, **_k: None)
    monkeypatch.setattr(p2p, "one_f_one_b", lambda *_a, **_k: None)
    blind = SimpleNamespace(events=lambda kind=None, since=0: [], mark=lambda: 0)  # e.g. a log it never found
    ctx = SimpleNamespace(rank=0, world_size=2, target=SimpleNamespace(name="nccl"), probe=blind,
                          init_world=lambda mode: None, expect=lambda *_a, **_k: None)
    with pytest.raises(NotObservable, match="no communicator"):
        p2p.eager_reuse(ctx)
