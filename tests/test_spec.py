"""The spec catalog: loading, validation errors naming file/id/field, binding to checks."""

import re
import shutil
from pathlib import Path

import pytest

from conformance.checks import bind_checks
from conformance.checks.registry import _REGISTRY, load_checks
from conformance.spec import AREAS, SpecError, load_catalog
from conformance.spec.catalog import SPEC_DIR


@pytest.fixture
def spec_copy(tmp_path: Path) -> Path:
    for area in AREAS:
        shutil.copy(SPEC_DIR / f"{area}.toml", tmp_path / f"{area}.toml")
    return tmp_path


def test_catalog_covers_every_area_with_unique_ids() -> None:
    catalog = load_catalog()
    assert {r.area for r in catalog} == set(AREAS)
    assert len({r.id for r in catalog}) == len(catalog)
    assert all(r.level in ("MUST", "SHOULD") and r.source and r.torch for r in catalog)


def test_every_requirement_has_a_check_and_back() -> None:
    assert set(bind_checks(load_catalog())) == {r.id for r in load_catalog()}


def test_bad_level_names_file_requirement_and_field(spec_copy: Path) -> None:
    path = spec_copy / "split.toml"
    path.write_text(path.read_text().replace('level = "MUST"', 'level = "MAY"', 1))
    with pytest.raises(SpecError) as err:
        load_catalog(spec_copy)
    assert (err.value.file, err.value.requirement, err.value.field) == ("split.toml", "SPLIT-UNBOUND-REFUSED", "level")


def test_missing_field_is_named(spec_copy: Path) -> None:
    path = spec_copy / "hints.toml"
    text = path.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith('source = "ProcessGroupNCCL.Options'))
    path.write_text(text.replace(line + "\n", "", 1))
    with pytest.raises(SpecError, match=r"hints.toml: requirement 'HINT-INIT-OPTIONS', field 'source'"):
        load_catalog(spec_copy)


def test_bad_torch_range_and_duplicate_id(spec_copy: Path) -> None:
    path = spec_copy / "p2p.toml"
    text = path.read_text()
    broken = re.sub(r'^torch = ".*"$', 'torch = "two"', text, count=1, flags=re.MULTILINE)
    assert broken != text, "the edit must hit a torch range"
    path.write_text(broken)
    with pytest.raises(SpecError, match="field 'torch'"):
        load_catalog(spec_copy)
    shutil.copy(SPEC_DIR / "p2p.toml", path)
    dup = (spec_copy / "coalescing.toml")
    dup.write_text(dup.read_text().replace('id = "COAL-SYNC-RESULTS"', 'id = "P2P-DATA"'))
    with pytest.raises(SpecError, match="duplicate id"):
        load_catalog(spec_copy)


def test_requirement_without_check_and_check_without_requirement_are_errors() -> None:
    catalog = load_catalog()
    load_checks()  # registers every check: this test may be the first of its worker to need them
    saved = _REGISTRY.pop("P2P-DATA")
    try:
        with pytest.raises(SpecError, match=r"P2P-DATA.*has no check"):
            bind_checks(catalog)
    finally:
        _REGISTRY["P2P-DATA"] = saved
    with pytest.raises(SpecError, match="check has no requirement"):
        bind_checks([r for r in catalog if r.id != "P2P-DATA"])


def test_finding_torch_says_where_a_finding_holds_and_reports_it_fixed_elsewhere(spec_copy: Path) -> None:
    """A finding scoped to torch <2.14 is a finding on 2.13 and 'fixed upstream' on 2.15, pass noted as such."""
    from conformance.report import Result
    from conformance.session import fixed_upstream

    req = {r.id: r for r in load_catalog()}["QUAL-OOT-DEVICES-STRING"]
    assert req.finding_holds("2.13.0+cpu") and not req.finding_holds("2.15.0+cu132")
    assert req.finding_text("2.13.0").startswith("Finding: ")
    assert "fixed upstream, does not hold on 2.15.0" in req.finding_text("2.15.0")
    passed = Result(req.id, req.area, req.level, 2, "pass", "", 0.0)
    (on_215,) = fixed_upstream([passed], "2.15.0")
    assert on_215.notes == ["fixed upstream: the spec's finding held on torch <2.14, not on 2.15.0"]
    assert fixed_upstream([passed], "2.13.0")[0].notes == []
    path = spec_copy / "split.toml"
    scoped = 'torch = ">=2.11,<2.15"'
    path.write_text(path.read_text().replace(scoped, scoped + '\nfinding_torch = "<2.14"', 1))
    with pytest.raises(SpecError) as err:
        load_catalog(spec_copy)
    assert (err.value.requirement, err.value.field) == ("SPLIT-UNBOUND-REFUSED", "finding_torch")


def test_min_world_size_one_runs_a_requirement_on_one_rank_and_the_default_needs_two() -> None:
    by_id = {r.id: r for r in load_catalog()}
    one_rank = by_id["HINT-INIT-OPTIONS"]  # one rank's communicator carries the hints: a one-GPU host judges it
    exchange = by_id["P2P-DATA"]  # a send needs a peer
    assert one_rank.min_world_size == 1 and one_rank.applies_to_world_size(1) and one_rank.applies_to_world_size(8)
    assert exchange.min_world_size == 2 and not exchange.applies_to_world_size(1) and exchange.applies_to_world_size(2)
    listed = next(r for r in load_catalog() if r.world_sizes)
    assert not listed.applies_to_world_size(max(listed.world_sizes) + 1)


def test_min_world_size_outside_one_or_two_is_refused(spec_copy: Path) -> None:
    path = spec_copy / "hints.toml"
    path.write_text(path.read_text().replace("min_world_size = 1", "min_world_size = 3", 1))
    with pytest.raises(SpecError, match="min_world_size"):
        load_catalog(spec_copy)
