"""The image's pinned packages (deploy/image/requirements.txt, made by deploy/image/lock.sh)
satisfy pyproject.toml's dependencies; the image build's `pip check` verifies the rest."""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flowforge.localdev.binaries import repo_root

ROOT = repo_root()


def _pins() -> dict[str, str]:
    lines = (ROOT / "deploy" / "image" / "requirements.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line and not line.startswith("#")]
    assert all(len(pair) == 2 for pair in pairs), "every line is name==version"
    return {canonicalize_name(name): version for name, version in pairs}


def test_every_dependency_is_pinned_within_its_range() -> None:
    pins = _pins()
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dependency in map(Requirement, dependencies):
        name = canonicalize_name(dependency.name)
        assert name in pins, f"{dependency.name} is not pinned: run deploy/image/lock.sh"
        assert dependency.specifier.contains(pins[name], prereleases=True), (
            f"{dependency.name}=={pins[name]} is outside {dependency.specifier}: "
            "run deploy/image/lock.sh"
        )
