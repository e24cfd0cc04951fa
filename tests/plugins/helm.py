"""The Helm chart rendered and installed with the real helm binary (built with the control
plane): ``helm`` (module scope), a ``Helm`` with its state in a folder of ours.

- ``Helm.template(values)``: the chart's manifests for those values;
- ``Helm.run("install"|"upgrade", ..., kubeconfig=)`` names this control plane's controller
  manager user in ``rbac.jobControllerUsers`` (``job_controllers``);
- ``one_manifest(manifests, kind)``: the one manifest of a kind.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowforge.localdev.binaries import BinariesMissingError, find_bin_dir, repo_root

CHART = repo_root() / "charts" / "flowforge"
KUBE_VERSION = "1.34.4"
RELEASE_NAMESPACE = "flowforge-system"

Manifest = dict[str, Any]


def job_controllers(kubectl_binary: Path, kubeconfig: Path) -> list[str]:
    """Who creates Jobs' Pods on the tests' control plane: its controller manager runs with
    the admin's credentials (no --use-service-account-credentials), so the chart's policy
    that only the operator and the Job controller make FlowForge's Pods must name that user
    besides the defaults (``rbac.jobControllerUsers``)."""
    whoami = subprocess.run(
        [str(kubectl_binary), "--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    user = str(json.loads(whoami.stdout)["status"]["userInfo"]["username"])
    return [
        "system:serviceaccount:kube-system:job-controller",
        "system:kube-controller-manager",
        user,
    ]


class Helm:
    """The helm binary built with the control plane, with its state in a folder of ours."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.environment = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        self.values_dir = home / "values"
        self.values_dir.mkdir(parents=True, exist_ok=True)

    def run(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command = [str(self.binary), *args]
        if kubeconfig is not None:
            command += ["--kubeconfig", str(kubeconfig)]
        if kubeconfig is not None and args and args[0] in ("install", "upgrade"):
            users = job_controllers(self.binary.parent / "kubectl", kubeconfig)
            command += ["--set-json", f"rbac.jobControllerUsers={json.dumps(users)}"]
        completed = subprocess.run(
            command, env=self.environment, capture_output=True, text=True, timeout=180, check=False
        )
        if check and completed.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{completed.stderr}")
        return completed

    def values_file(self, values: dict[str, Any]) -> Path:
        path = self.values_dir / f"{uuid.uuid4().hex}.yaml"
        path.write_text(yaml.safe_dump(values))
        return path

    def template(
        self, values: dict[str, Any], *, release: str = "ff", namespace: str = RELEASE_NAMESPACE
    ) -> list[Manifest]:
        completed = self.run(
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            KUBE_VERSION,
            "-f",
            str(self.values_file(values)),
        )
        return [doc for doc in yaml.safe_load_all(completed.stdout) if doc]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    try:
        bin_dir = find_bin_dir()
    except BinariesMissingError as error:
        pytest.fail(f"helm unavailable: {error}", pytrace=False)
    return Helm(bin_dir / "helm", tmp_path_factory.mktemp("helm"))


def one_manifest(manifests: list[Manifest], kind: str) -> Manifest:
    """The one manifest of ``kind`` rendered."""
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} rendered"
    return found[0]
