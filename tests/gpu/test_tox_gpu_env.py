"""`tox -e gpu` runs on the GPU runner's own torch: nothing is installed from an index there (issue 26, item 8).

Checked by running it (tox 4.67, no index, the torch 2.13 venv's site-packages standing in for the runner's):
the suite installs without its dependencies and pytest imports that torch."""

from __future__ import annotations

import configparser
from pathlib import Path

TOX = Path(__file__).parents[2] / "tox.ini"


def _gpu() -> configparser.SectionProxy:
    config = configparser.ConfigParser(interpolation=None)
    config.read(TOX)
    return config["testenv:gpu"]


def test_gpu_env_uses_the_runners_site_packages_and_installs_no_torch():
    env = _gpu()
    assert env.getboolean("sitepackages") and env.getboolean("skip_install")
    assert env.get("deps", "").strip() == ""  # not inherited from [testenv], which pins the CPU torch
    installs = [line for line in env["commands_pre"].splitlines() if "pip install" in line]
    assert installs and all("--no-deps" in line and "--no-index" in line for line in installs)
