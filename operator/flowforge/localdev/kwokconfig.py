"""The kwokctl configuration of a local cluster: binary runtime, loopback only,
ports chosen by us, and FlowForge's kwok stages (deploy/local/kwok-stages.yaml)."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from flowforge.localdev.binaries import deploy_local_dir

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ClusterPorts:
    """TCP ports on 127.0.0.1, one per listening component."""

    apiserver: int
    etcd: int
    etcd_peer: int
    controller_manager: int
    scheduler: int
    kwok_controller: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def pick_free_ports() -> ClusterPorts:
    """Ports the kernel hands out for loopback binds right now.

    All sockets stay open until every port is chosen, so the six differ; kwokctl's
    own choice (counting down from 32767) would give concurrent test processes the
    same ports. A port can still be taken between here and the component's bind;
    start_cluster retries on "address already in use".
    """
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(6):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(int(sock.getsockname()[1]))
    return ClusterPorts(*ports)


def stages_file() -> Path:
    return deploy_local_dir() / "kwok-stages.yaml"


def kwokctl_configuration(
    *,
    bin_dir: Path,
    ports: ClusterPorts,
    kube_version: str,
    kwok_version: str,
    controller_manager_qps: int | None = None,
) -> dict[str, Any]:
    """``controller_manager_qps`` lifts kube-controller-manager's client limit (20 requests/s,
    bursts of 30 by default; burst twice the rate here). The default caps a cluster at about
    200 Jobs a minute, a Job costing the Job controller about six writes."""
    patches: list[dict[str, Any]] = [
        {"name": "kwok-controller", "extraArgs": [{"key": "node-ip", "value": LOOPBACK}]},
    ]
    if controller_manager_qps is not None:
        patches.append(
            {
                "name": "kube-controller-manager",
                "extraArgs": [
                    {"key": "kube-api-qps", "value": str(controller_manager_qps)},
                    {"key": "kube-api-burst", "value": str(2 * controller_manager_qps)},
                ],
            }
        )
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "bindAddress": LOOPBACK,
            "kubeVersion": kube_version,
            "kwokVersion": kwok_version,
            "kubeApiserverBinary": str(bin_dir / "kube-apiserver"),
            "kubeControllerManagerBinary": str(bin_dir / "kube-controller-manager"),
            "kubeSchedulerBinary": str(bin_dir / "kube-scheduler"),
            "kubectlBinary": str(bin_dir / "kubectl"),
            "kwokControllerBinary": str(bin_dir / "kwok"),
            "etcdBinary": str(bin_dir / "etcd"),
            "kubeApiserverPort": ports.apiserver,
            "etcdPort": ports.etcd,
            "etcdPeerPort": ports.etcd_peer,
            "kubeControllerManagerPort": ports.controller_manager,
            "kubeSchedulerPort": ports.scheduler,
            "kwokControllerPort": ports.kwok_controller,
        },
        "componentsPatches": patches,
    }


def write_config(
    path: Path,
    *,
    bin_dir: Path,
    ports: ClusterPorts,
    kube_version: str,
    kwok_version: str,
    controller_manager_qps: int | None = None,
) -> None:
    """One multi-document file: the kwokctl configuration followed by our Stages."""
    configuration = kwokctl_configuration(
        bin_dir=bin_dir,
        ports=ports,
        kube_version=kube_version,
        kwok_version=kwok_version,
        controller_manager_qps=controller_manager_qps,
    )
    header = yaml.safe_dump(configuration, sort_keys=False)
    path.write_text(header + "---\n" + stages_file().read_text())
