"""The vendor flow end to end: the example backend certifies; the flawed one names the requirement it broke."""

import json
from pathlib import Path

import pytest

from conformance.cli import main

pytest.importorskip("toyccl", reason="examples/toyccl is not installed (pip install ./examples/toyccl)")
pytest.importorskip("toyccl_flawed", reason="examples/toyccl_flawed is not installed")


TOYCCL_CAPABILITIES = ("device_binding,split,options,hints,p2p_tags,p2p_any_source,lazy_pair_comms,uneven_all_gather,"
                       "p2p_unordered_receives,bitwise_reductions")
# toyccl moves every byte through the store: COAL-SYNC-RESULTS at world size 4 took 20-35 s on a loaded CI host and
# ran out of the default 30 s (+ grace) once (2026-11-30, load 7-8). The verdict, not the host's speed, is under test.
# The flawed backend keeps the default: a check it fails by hanging waits the timeout out.
PATIENT_TIMEOUT_S = "120"


def _certify(backend: str, tmp_path: Path, sizes: str = "2", timeout_s: str = "30", *extra: str) -> tuple[int, dict]:
    code = main(["certify", "--backend", backend, "--device", "cpu", "--import", backend, "--package", backend,
                 "--capability", TOYCCL_CAPABILITIES, "--world-sizes", sizes, "--timeout", timeout_s,
                 "--report-dir", str(tmp_path), *extra])
    return code, json.loads((tmp_path / f"{backend}.json").read_text())


# CI's pytest items name only the built-in targets, so this is the example's whole run, at world size 2 (on both
# of CI's torches). Its run at 4 (80 s of CPU, the largest item of CI) is left to the held-out judge, whose
# baseline certifies clean toyccl at 2 and 4 before any variant (scripts/heldout.py), and to reports/vendor-toyccl.
def test_example_backend_certifies(tmp_path: Path) -> None:
    code, report = _certify("toyccl", tmp_path, "2", PATIENT_TIMEOUT_S)
    assert code == 0 and report["verdict"] == "conformant"
    judged = report["summary"]["judged"]
    assert judged["judged"] >= 0.85 * judged["backend_musts"], judged["unjudged"]
    assert report["environment"].get("package") or report["environment"].get("backend_package")
    assert report["digest"]


def test_flawed_backend_is_non_conformant_naming_the_requirement(tmp_path: Path) -> None:
    # the flawed twin subclasses toyccl and overrides send and recv only, so its other areas are toyccl's own code,
    # certified by the test above: its P2P area is what is under test
    code, report = _certify("toyccl_flawed", tmp_path, "2", "30", "--area", "p2p")
    failed = {r["requirement"] for r in report["results"] if r["outcome"] == "fail" and r["level"] == "MUST"}
    assert code == 1 and report["verdict"] == "non-conformant"
    # the one flaw (send/recv drop their tag) breaks tagged delivery, which it declared (p2p_tags); every other
    # P2P requirement passes
    assert failed == {"P2P-DATA"}
    assert sum(r["outcome"] == "pass" for r in report["results"]) >= 5, report["results"]
    assert "tag 22 received first" in (tmp_path / "toyccl_flawed.md").read_text()
