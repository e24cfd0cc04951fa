"""A local cluster as its clients see it, and the kubectl built with it.

Kept apart from `controlplane` (which starts and stops clusters) so that tests and tools
that only talk to a cluster need none of the start-up machinery.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowforge.admission.certs import ClientCertificates
from flowforge.localdev.apiclient import JsonObject
from flowforge.localdev.kwokconfig import ADMISSION_DIR, ClusterPorts

CLUSTER_NAME = "flowforge"


def kwok_workdir(state_dir: Path) -> Path:
    return state_dir / "kwok"


def cluster_workdir(state_dir: Path) -> Path:
    return kwok_workdir(state_dir) / "clusters" / CLUSTER_NAME


@dataclass(frozen=True)
class Cluster:
    """A running local cluster; everything a client needs to reach it."""

    state_dir: Path
    kubeconfig: Path
    server: str
    bin_dir: Path
    ports: ClusterPorts
    node_name: str
    kube_version: str
    startup_seconds: float

    @property
    def kubectl_binary(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def webhook_client(self) -> ClientCertificates:
        """The client certificate the apiserver presents to admission webhooks, and its CA
        (what a webhook server started for this cluster must trust)."""
        return ClientCertificates.in_directory(self.state_dir / ADMISSION_DIR)

    @property
    def logs_dir(self) -> Path:
        return cluster_workdir(self.state_dir) / "logs"

    def to_json(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "bin_dir": str(self.bin_dir),
            "ports": self.ports.as_dict(),
            "node_name": self.node_name,
            "kube_version": self.kube_version,
            "startup_seconds": self.startup_seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cluster:
        return cls(
            state_dir=Path(data["state_dir"]),
            kubeconfig=Path(data["kubeconfig"]),
            server=data["server"],
            bin_dir=Path(data["bin_dir"]),
            ports=ClusterPorts(**data["ports"]),
            node_name=data["node_name"],
            kube_version=data["kube_version"],
            startup_seconds=float(data["startup_seconds"]),
        )


class KubectlError(RuntimeError):
    def __init__(self, args: Sequence[str], completed: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"kubectl {' '.join(args)} exited {completed.returncode}: {completed.stderr.strip()}"
        )
        self.returncode = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr


def kubectl(
    cluster: Cluster,
    *args: str,
    stdin: str | None = None,
    check: bool = True,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run the kubectl built with the server (same version) against the cluster."""
    options = [
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--cache-dir",
        str(cluster.state_dir / "kubectl-cache"),
    ]
    completed = subprocess.run(
        [str(cluster.kubectl_binary), *options, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and completed.returncode != 0:
        raise KubectlError(args, completed)
    return completed


def wait_established(cluster: Cluster, crds: Sequence[str], *, timeout: float = 60.0) -> None:
    """Wait until the apiserver serves the CRDs (``crd/NAME``); raises ``KubectlError``.
    Right after an apply a CRD's status may have no conditions yet, which `kubectl wait`
    does not wait for: it fails at once, so it is asked again."""
    deadline = time.monotonic() + timeout
    while True:
        args = ("wait", "--for=condition=Established", f"--timeout={timeout:.0f}s", *crds)
        waited = kubectl(cluster, *args, check=False, timeout=timeout + 10)
        if waited.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise KubectlError(args, waited)
        time.sleep(0.2)


def kubectl_json(cluster: Cluster, *args: str) -> JsonObject:
    result: JsonObject = json.loads(kubectl(cluster, *args, "-o", "json").stdout)
    return result
