"""The kwokctl configuration of a local cluster: binary runtime, loopback only,
ports chosen by us, FlowForge's kwok stages (deploy/local/kwok-stages.yaml), and an
AdmissionConfiguration under which kube-apiserver presents a client certificate to every
admission webhook (so a webhook can tell the apiserver from anyone else)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from flowforge.admission.certs import ClientCertificates, generate_client_certificates
from flowforge.localdev.binaries import deploy_local_dir

LOOPBACK = "127.0.0.1"
# kube-controller-manager's Job controller workers on a cluster whose client limit is lifted.
LIFTED_JOB_SYNC_WORKERS = 50


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


ADMISSION_DIR = "admission"
_WEBHOOK_PLUGINS = ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")


def write_admission_configuration(directory: Path) -> tuple[Path, ClientCertificates]:
    """A client CA and certificate, a kubeconfig presenting it to any webhook (user "*"), and
    the AdmissionConfiguration naming that kubeconfig for both webhook plugins."""
    certs = ClientCertificates.in_directory(directory)
    if not (certs.cert_path.exists() and certs.key_path.exists()):
        certs = generate_client_certificates(directory)
    kubeconfig = directory / "webhook-client.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "users": [
                    {
                        "name": "*",
                        "user": {
                            "client-certificate": str(certs.cert_path),
                            "client-key": str(certs.key_path),
                        },
                    }
                ],
            }
        )
    )
    configuration = directory / "admission-configuration.yaml"
    plugin_configuration = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    configuration.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": name, "configuration": plugin_configuration}
                    for name in _WEBHOOK_PLUGINS
                ],
            },
            sort_keys=False,
        )
    )
    return configuration, certs


def stages_file() -> Path:
    return deploy_local_dir() / "kwok-stages.yaml"


def kwokctl_configuration(
    *,
    bin_dir: Path,
    ports: ClusterPorts,
    kube_version: str,
    kwok_version: str,
    admission_configuration: Path | None = None,
    controller_manager_qps: int | None = None,
) -> dict[str, Any]:
    """``controller_manager_qps`` lifts kube-controller-manager's client limit (20 requests/s,
    bursts of 30 by default; burst twice the rate here). The default caps a cluster at about
    200 Jobs a minute, a Job costing the Job controller about six writes. Lifting it also gives
    the Job controller more workers (``--concurrent-job-syncs``, 5 by default): a Job takes it
    three syncs of one or more writes each, so with the apiserver busy (150-200 ms a sync on
    our 2 cores) five workers queue a Job for seconds at 50 Jobs in flight."""
    patches: list[dict[str, Any]] = [
        {"name": "kwok-controller", "extraArgs": [{"key": "node-ip", "value": LOOPBACK}]},
    ]
    if admission_configuration is not None:
        patches.append(
            {
                "name": "kube-apiserver",
                "extraArgs": [
                    {"key": "admission-control-config-file", "value": str(admission_configuration)}
                ],
            }
        )
    if controller_manager_qps is not None:
        patches.append(
            {
                "name": "kube-controller-manager",
                "extraArgs": [
                    {"key": "kube-api-qps", "value": str(controller_manager_qps)},
                    {"key": "kube-api-burst", "value": str(2 * controller_manager_qps)},
                    {"key": "concurrent-job-syncs", "value": str(LIFTED_JOB_SYNC_WORKERS)},
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
    admission_configuration: Path | None = None,
    controller_manager_qps: int | None = None,
    extra_stages: Sequence[Path] = (),
) -> None:
    """One multi-document file: the kwokctl configuration followed by our Stages and those of
    ``extra_stages``."""
    configuration = kwokctl_configuration(
        bin_dir=bin_dir,
        ports=ports,
        kube_version=kube_version,
        kwok_version=kwok_version,
        admission_configuration=admission_configuration,
        controller_manager_qps=controller_manager_qps,
    )
    header = yaml.safe_dump(configuration, sort_keys=False)
    stages = [stages_file().read_text(), *(extra.read_text() for extra in extra_stages)]
    path.write_text(header + "".join("---\n" + text.rstrip("\n") + "\n" for text in stages))
