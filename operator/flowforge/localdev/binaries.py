"""Where the locally built control-plane binaries live.

deploy/local/versions.env pins the versions; deploy/local/build.sh builds them
into a cache directory named after those versions. This module computes the same
directory so that callers can find the binaries without running the build.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REQUIRED_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kwokctl",
)
BUILD_COMMAND = "bash deploy/local/build.sh  (or: make controlplane)"


class BinariesMissingError(RuntimeError):
    """The control-plane binaries have not been built (or not at the pinned versions)."""


def repo_root() -> Path:
    """The checkout this package lives in (operator/flowforge/localdev -> repo root)."""
    return Path(__file__).resolve().parents[3]


def deploy_local_dir() -> Path:
    return repo_root() / "deploy" / "local"


def read_versions(versions_file: Path | None = None) -> dict[str, str]:
    """The KEY=VALUE pins of deploy/local/versions.env."""
    path = versions_file or deploy_local_dir() / "versions.env"
    pins: dict[str, str] = {}
    for raw_line in path.read_text().splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        pins[key.strip()] = value.strip().strip('"').strip("'")
    return pins


def expected_bin_dir(versions: dict[str, str] | None = None) -> Path:
    """The cache directory build.sh writes to for the pinned versions."""
    pins = versions or read_versions()
    cache_root = _cache_root()
    tag = (
        f"k8s-{pins['KUBE_VERSION']}_etcd-{pins['ETCD_VERSION']}"
        f"_kwok-{pins['KWOK_VERSION']}_helm-{pins['HELM_VERSION']}"
    )
    return cache_root / f"controlplane-{tag}" / "bin"


KUEUE_BUILD_COMMAND = "bash deploy/local/build-kueue.sh  (or: make kueue)"


def _cache_root() -> Path:
    return Path(os.environ.get("FLOWFORGE_CACHE", str(Path.home() / ".cache" / "flowforge")))


def kueue_dir(versions: dict[str, str] | None = None) -> Path:
    """Where deploy/local/build-kueue.sh keeps the pinned Kueue: ``bin/kueue`` (the
    controller manager), ``crds/`` and ``webhooks.yaml`` from the same module."""
    pins = versions or read_versions()
    return _cache_root() / f"kueue-{pins['KUEUE_VERSION']}"


def find_kueue() -> Path:
    """The Kueue directory when its binary, CRDs and webhooks are all there; otherwise
    BinariesMissingError names the build command."""
    home = kueue_dir()
    missing = [
        str(path) for path in (home / "bin" / "kueue", home / "webhooks.yaml") if not path.exists()
    ]
    if not list((home / "crds").glob("*.yaml")):
        missing.append(str(home / "crds" / "*.yaml"))
    if missing:
        raise BinariesMissingError(
            f"Kueue is not built: missing {', '.join(missing)}. Build it once with: "
            f"{KUEUE_BUILD_COMMAND} (about 4 minutes)."
        )
    return home


def missing_binaries(bin_dir: Path) -> list[str]:
    return [name for name in REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]


def find_bin_dir(*, build: bool = False) -> Path:
    """The directory holding every control-plane binary.

    FLOWFORGE_CONTROLPLANE_BIN overrides the computed cache directory. With
    build=True a missing set is built by deploy/local/build.sh (idempotent, slow
    when cold); otherwise BinariesMissingError names the build command.
    """
    override = os.environ.get("FLOWFORGE_CONTROLPLANE_BIN")
    bin_dir = Path(override) if override else expected_bin_dir()
    missing = missing_binaries(bin_dir)
    if not missing:
        return bin_dir
    if build and not override:
        return _run_build()
    raise BinariesMissingError(
        f"control-plane binaries missing from {bin_dir}: {', '.join(missing)}. "
        f"Build them once with: {BUILD_COMMAND} (cold build takes tens of minutes)."
    )


def _run_build() -> Path:
    script = deploy_local_dir() / "build.sh"
    completed = subprocess.run(
        ["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False
    )
    if completed.returncode != 0:
        raise BinariesMissingError(f"{script} failed with exit code {completed.returncode}")
    bin_dir = Path(completed.stdout.strip().splitlines()[-1])
    missing = missing_binaries(bin_dir)
    if missing:
        raise BinariesMissingError(f"{script} finished but {bin_dir} lacks {', '.join(missing)}")
    return bin_dir
