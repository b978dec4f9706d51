"""The committed selection of torch's own tests is well-formed, and the file checks catch what they name."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.fidelity import selection


def test_the_committed_selection_loads_and_each_gloo_only_test_is_selected() -> None:
    chosen = selection.load()
    assert len(chosen.tests) == len(set(chosen.tests)) >= 149
    for group in chosen.gloo_only.values():
        assert group.reason and group.source
        assert all(chosen.area_of(t) for t in group.tests)


@pytest.mark.parametrize(("text", "says"), [
    ('[areas]\na = ["test_x", "test_x"]\n', "tests listed twice: ['test_x']"),
    ('[areas]\na = ["test_x"]\n[gloo_only.g]\ntests = ["test_y"]\nreason = "r"\nsource = ["s"]\n',
     "gloo_only names tests not in any area: ['test_y']"),
])
def test_a_bad_selection_is_refused_naming_the_tests(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "selection.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}: " + says.replace("[", r"\[").replace("]", r"\]")):
        selection.load(path)
