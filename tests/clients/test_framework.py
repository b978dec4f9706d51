"""`python -m conformance framework`: a framework's own group builder on the simulator (a chosen
stack, bound parent), its groups judged for members, inherited binding, qualified filters and
options that arrive; each judgement shown to fail on a flawed builder or a planted defect."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch.distributed as dist

from conformance import framework
from conformance.cli import main
from conformance.torch_compat import since

BUILDERS = "conformance.framework_builders"


def outcomes(results) -> dict[str, tuple[str, str]]:
    return {r.requirement: (r.outcome, r.detail) for r in results}


def test_megatron_like_builder_at_world_8() -> None:
    got = outcomes(framework.run(f"{BUILDERS}:megatron_like", 8, {}, stack="torchcomms"))
    assert got["SPLIT-MEMBERSHIP"] == ("pass", "20 groups judged on 8 ranks")
    assert got["SPLIT-BOUND-INHERIT"] == ("pass", "20 groups judged on 8 ranks")
    assert got["QUAL-SUBGROUP-FILTER"][0] == "skip" and "no backend filter" in got["QUAL-SUBGROUP-FILTER"][1]
    assert got["HINT-TORCHCOMMS-OPTIONS"][0] == "skip" and "no pg_options" in got["HINT-TORCHCOMMS-OPTIONS"][1]


def test_builder_with_filters_and_options_passes_every_judgement() -> None:
    got = outcomes(framework.run(f"{BUILDERS}:with_options", 4, {"tp": 2}, stack="torchcomms"))
    assert {k: v[0] for k, v in got.items()} == dict.fromkeys(framework.CHECKS, "pass"), got


def test_options_as_hints_are_judged_on_the_torchcomms_stack_only() -> None:
    got = outcomes(framework.run(f"{BUILDERS}:with_options", 4, {"tp": 2}, stack="nccl-legacy"))
    outcome, detail = got["HINT-TORCHCOMMS-OPTIONS"]
    assert outcome == "skip" and "torchcomms stack only, not on nccl-legacy" in detail, detail


def test_a_gloo_group_is_judged_by_the_binding_it_shows_not_failed_for_lacking_a_simulator_communicator() -> None:
    got = outcomes(framework.run(f"{BUILDERS}:with_gloo_groups", 4, {}, stack="torchcomms"))
    assert got["SPLIT-BOUND-INHERIT"] == ("pass", "4 groups judged on 4 ranks"), got["SPLIT-BOUND-INHERIT"]
    assert got["SPLIT-MEMBERSHIP"][0] == "pass", got["SPLIT-MEMBERSHIP"]


def test_bare_filter_fails_naming_it() -> None:
    got = outcomes(framework.run(f"{BUILDERS}:bare_filter", 4, {}, stack="torchcomms"))
    outcome, detail = got["QUAL-SUBGROUP-FILTER"]
    assert outcome == "fail" and "backend filter 'sim'" in detail and "<device>:<backend>" in detail, detail
    assert "Megatron-LM PR 5385" in detail and "pass backend='cpu:sim'" in detail, detail


# megatron_like's groups are new_groups: split from the world's communicator on nccl-legacy on every torch (on
# torchcomms only before 2.15, v2.15.0 distributed_c10d.py:7130-7136), so its split defects are planted there
@pytest.mark.parametrize(("defect", "builder", "stack", "requirement", "needle"), [
    ("split_child_unbound", "megatron_like", "nccl-legacy", "SPLIT-BOUND-INHERIT",
     "expected communicator device cpu:0"),
    ("split_fresh_bootstrap", "megatron_like", "nccl-legacy", "SPLIT-BOUND-INHERIT",
     "expected a communicator split from"),
    ("torchcomms_drops_options", "with_options", "torchcomms", "HINT-TORCHCOMMS-OPTIONS",
     "expected hints {'maxCTAs': '8'"),
    ("split_fresh_bootstrap", "pr5385", "torchcomms", "SPLIT-BOUND-INHERIT", "expected a communicator split from"),
    ("torchcomms_drops_options", "pr5385", "torchcomms", "HINT-TORCHCOMMS-OPTIONS",
     "expected hints {'is_high_priority_stream': 'true', 'netName': 'ib'}"),
])
def test_planted_defects_fail_their_judgement(monkeypatch: pytest.MonkeyPatch, defect: str, builder: str, stack: str,
                                              requirement: str, needle: str) -> None:
    monkeypatch.setenv("SIM_DEFECTS", defect)  # inherited by the forked ranks
    kwargs = {"pipeline_backend": None} if builder == "pr5385" else {}  # every group split on torchcomms
    outcome, detail = outcomes(framework.run(f"{BUILDERS}:{builder}", 4, kwargs, timeout_s=20,
                                             stack=stack))[requirement]
    assert outcome == "fail" and needle in detail, detail


def test_a_new_group_the_stack_does_not_split_is_judged_by_a_fresh_communicator() -> None:
    """torch 2.15's torchcomms routing makes a new_group's communicator with new_comm among its members (v2.15.0
    distributed_c10d.py:7130-7136): there a split one fails, a fresh one on the parent's device passes."""
    obs = {"member": True, "got_group": True, "ranks": [0, 1], "bound": "cpu:0", "parent_bound": "cpu:0",
           "backend": None, "split": False, "comm_mode": "split", "comm_parent": "c0", "parent_comm": "c0",
           "comm_device": "cpu:0", "parent_device": "cpu:0"}
    assert framework._binding(obs, 1) == ["rank 1: group [0, 1]: expected a fresh communicator among the members "
                                          "(new_comm, not split), observed mode 'split' with parent c0"]
    assert framework._binding({**obs, "comm_mode": "eager", "comm_parent": None}, 1) == []
    assert framework._binding({**obs, "split": True, "comm_mode": "eager", "comm_parent": None}, 1) == [
        "rank 1: group [0, 1]: expected a communicator split from c0, observed mode 'eager' with parent None"]


@pytest.mark.parametrize("stack", ["nccl-legacy", "nccl2", "nccl-lazy"])
def test_pr5385_layout_passes_on_the_nccl_stacks(stack: str) -> None:
    """Every covering kind from one split_group call, pipeline groups members-only on the lazy backend: 10
    splits and 2 pipeline groups at world 4 (tp 2, pp 2)."""
    got = outcomes(framework.run(f"{BUILDERS}:pr5385", 4, {}, stack=stack))
    for rid in ("SPLIT-MEMBERSHIP", "SPLIT-BOUND-INHERIT", "QUAL-SUBGROUP-FILTER"):
        assert got[rid] == ("pass", "12 groups judged on 4 ranks"), (rid, got[rid])
    assert got["HINT-TORCHCOMMS-OPTIONS"][0] == "skip", got


def test_pr5385_layout_on_torchcomms_per_torch_version() -> None:
    """torch 2.13's torchcomms routing makes new_group through split_group and refuses a members-only group on
    every rank (v2.13.0 distributed_c10d.py:5836, :5893); 2.15 makes it with new_comm (v2.15.0 :7130-7136)."""
    got = outcomes(framework.run(f"{BUILDERS}:pr5385", 4, {}, stack="torchcomms"))
    if since("2.15"):
        assert got["SPLIT-MEMBERSHIP"] == ("pass", "12 groups judged on 4 ranks"), got
        assert got["HINT-TORCHCOMMS-OPTIONS"][0] == "pass" and "2 of another backend not judged" in \
            got["HINT-TORCHCOMMS-OPTIONS"][1], got
    else:
        outcome, detail = got["SPLIT-MEMBERSHIP"]
        assert outcome == "error" and "ranks 0-3 raised: NotImplementedError: new_group cannot delegate to " \
            "split_group with use_local_synchronization=True" in detail, detail
    fixed = outcomes(framework.run(f"{BUILDERS}:pr5385", 4, {"pipeline_backend": None}, stack="torchcomms"))
    assert {k: v for k, (v, _) in fixed.items()} == dict.fromkeys(framework.CHECKS, "pass"), fixed


def test_the_report_says_when_the_run_started(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'started' is taken before the builder runs (it equalled 'finished'): a run made to last over a second
    boundary shows two different times."""
    run = framework.run

    def slow_run(*args, **kwargs):
        time.sleep(1.1)
        return run(*args, **kwargs)

    monkeypatch.setattr(framework, "run", slow_run)
    assert main(["framework", "--builder", f"{BUILDERS}:with_options", "--world-size", "2", "--kwargs",
                 json.dumps({"tp": 2}), "--report-dir", str(tmp_path), "--stack", "torchcomms"]) == 0
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert report["started"] < report["finished"], (report["started"], report["finished"])


def test_cli_writes_a_report(tmp_path) -> None:
    code = main(["framework", "--builder", f"{BUILDERS}:with_options", "--world-size", "4",
                 "--kwargs", json.dumps({"tp": 2}), "--report-dir", str(tmp_path), "--stack", "torchcomms"])
    assert code == 0
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert report["verdict"] == "conformant" and report["environment"]["builder"] == f"{BUILDERS}:with_options"
    assert report["environment"]["stack"] == "torchcomms"
    assert main(["framework", "--builder", "no_colon", "--report-dir", str(tmp_path)]) == 2


MEGATRON = "megatron.core.parallel_state:initialize_model_parallel"


def _need_megatron() -> None:
    """Skip without Megatron-Core, without importing it here: its import registers torch's "fake" backend as the
    default of "hpu" in this process, which every later check forked from it inherits (QUAL-OOT-REGISTRATION
    then fails with "devices already claimed"); the framework's rank processes import it."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("Megatron-Core is not installed (the test extra installs it)")
TP2_PP2 = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}


@pytest.mark.parametrize("stack", ["nccl-legacy", "torchcomms"])
def test_megatron_core_initialize_model_parallel(stack: str) -> None:
    """Megatron-Core's own builder (world 4 here, 8 in the issue's table): its groups are right, and its bare "gloo"
    filters are the finding."""
    _need_megatron()
    claimed = dict(dist.Backend.default_device_backend_map)
    got = outcomes(framework.run(MEGATRON, 4, TP2_PP2, stack=stack))
    assert dict(dist.Backend.default_device_backend_map) == claimed  # imported by the ranks only
    assert got["SPLIT-MEMBERSHIP"][0] == "pass" and "groups judged on 4 ranks" in got["SPLIT-MEMBERSHIP"][1], got
    assert got["SPLIT-BOUND-INHERIT"][0] == "pass", got
    outcome, detail = got["QUAL-SUBGROUP-FILTER"]
    assert outcome == "fail" and "backend filter 'gloo'" in detail and "Megatron-LM PR 5385" in detail, detail


def test_megatron_core_breaks_on_nccl2_at_its_eager_new_group_with_non_members() -> None:
    _need_megatron()
    outcome, detail = outcomes(framework.run(MEGATRON, 4, TP2_PP2, timeout_s=5, stack="nccl2"))["SPLIT-MEMBERSHIP"]
    assert outcome == "error" and "'ProcessGroupNCCL2' object has no attribute 'perform_nocolor_split'" in detail, \
        detail
