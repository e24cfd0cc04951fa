"""pytest fixture for Kueue, the real controller manager, against the test control plane.

- ``kueue`` (session): Kueue's CRDs applied from the pinned module, its controller manager
  (built by deploy/local/build-kueue.sh) started on 127.0.0.1 with its own configuration,
  and its webhooks registered with the apiserver by URL. Started only by the tests that ask
  for it, once per session; stopped (webhooks removed first) at the end. A missing build is
  a failure naming the build command, never a skip.

How Kueue v0.17.0 is run here (read from cmd/kueue/main.go and pkg/config of the module):

- ``internalCertManagement.enable: false``: no cert rotator, no Secret, no Service; the
  webhook server (``webhook.host: 127.0.0.1``, ``webhook.port``) reads ``tls.crt`` and
  ``tls.key`` from ``webhook.certDir``, a directory of ours.
- ``metrics.bindAddress`` and ``health.healthProbeBindAddress`` on 127.0.0.1 ports.
  The metrics server's certificate path is not configurable: with internal cert management
  off, main.go reads ``/etc/kueue/metrics/certs/tls.{crt,key}``, so a self-signed pair for
  127.0.0.1 is installed there once (atomically; never replaced).
- ``featureGates: {VisibilityOnDemand: false}``: the visibility API server would read its
  certificate from the fixed ``/visibility`` directory and bind all interfaces; FlowForge
  does not use it.
- ``leaderElection.leaderElect: false`` (one instance), ``integrations.frameworks:
  [batch/job]`` and ``manageJobsWithoutQueueName: false``: only Jobs with the
  ``kueue.x-k8s.io/queue-name`` label are Kueue's.
- Webhooks: the module's config/components/webhook/manifests.yaml, kept for Kueue's own
  kinds and batch Jobs, each pointed at ``https://127.0.0.1:PORT/<path>`` with our CA; the
  Job webhooks only see Jobs that carry the queue-name label (``objectSelector``), so the
  other tests' Jobs never wait on Kueue.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowforge.admission.certs import generate_webhook_certificates
from flowforge.localdev.binaries import BinariesMissingError, find_kueue, read_versions
from flowforge.localdev.cluster import KubectlError, wait_established
from flowforge.localdev.controlplane import Cluster, kubectl
from tests.support.waiting import wait_until_blocking

KUEUE_GROUP = "kueue.x-k8s.io"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
STARTUP_TIMEOUT_SECONDS = 90.0
WEBHOOK_CONFIG_NAME = "flowforge-test-kueue"
DEFAULT_FLAVOR = "default-flavor"


@dataclass(frozen=True)
class Kueue:
    cluster: Cluster
    process: subprocess.Popen[bytes]
    log_path: Path
    startup_seconds: float

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def assert_alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"Kueue exited with {code}:\n{self.log_tail()}"

    def apply(self, *objects: dict[str, Any]) -> None:
        kubectl(self.cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))

    def queue(self, *, namespace: str, cpu: str, preemption: bool = False) -> str:
        """A ClusterQueue with ``cpu`` of quota for ``namespace`` only, and a LocalQueue of
        the same name there; returns the name."""
        name = f"cq-{namespace}"[:63]
        spec: dict[str, Any] = {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": namespace},
            },
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [
                        {
                            "name": DEFAULT_FLAVOR,
                            "resources": [{"name": "cpu", "nominalQuota": cpu}],
                        }
                    ],
                }
            ],
        }
        if preemption:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        self.apply(
            {
                "apiVersion": f"{KUEUE_GROUP}/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": spec,
            },
            {
                "apiVersion": f"{KUEUE_GROUP}/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": name},
            },
        )
        return name

    def delete_queue(self, *, namespace: str, name: str) -> None:
        kubectl(self.cluster, "delete", "-n", namespace, "localqueue", name, check=False)
        kubectl(self.cluster, "delete", "clusterqueue", name, "--wait=false", check=False)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _install_metrics_certificate() -> None:
    """Kueue's metrics server reads its certificate from a fixed path (see the module)."""
    if (METRICS_CERT_DIR / "tls.crt").exists() and (METRICS_CERT_DIR / "tls.key").exists():
        return
    try:
        METRICS_CERT_DIR.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".certs-", dir=METRICS_CERT_DIR.parent))
    except OSError as error:
        pytest.fail(
            f"Kueue reads its metrics certificate from {METRICS_CERT_DIR} (a fixed path in "
            f"cmd/kueue/main.go) and it cannot be created: {error}",
            pytrace=False,
        )
    generate_webhook_certificates(staging, hosts=("127.0.0.1", "localhost"))
    staging.chmod(0o755)
    try:
        staging.rename(METRICS_CERT_DIR)  # atomic; a concurrent session may have won
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)


def _configuration(*, certs: Path, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
        "webhook": {"host": "127.0.0.1", "port": ports["webhook"], "certDir": str(certs)},
        "featureGates": {"VisibilityOnDemand": False},
        "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 50, "burst": 100},
    }


def _ours(webhook: dict[str, Any]) -> bool:
    for rule in webhook.get("rules") or []:
        groups = set(rule.get("apiGroups") or [])
        if KUEUE_GROUP in groups or ("batch" in groups and "jobs" in rule.get("resources", [])):
            return True
    return False


def _webhook_configurations(manifests: Path, *, port: int, ca: bytes) -> list[dict[str, Any]]:
    import base64

    bundle = base64.b64encode(ca).decode()
    configurations = []
    for document in yaml.safe_load_all(manifests.read_text()):
        if not document:
            continue
        hooks = [hook for hook in document.get("webhooks") or [] if _ours(hook)]
        for hook in hooks:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            hook["timeoutSeconds"] = 10
            if any("batch" in (rule.get("apiGroups") or []) for rule in hook.get("rules") or []):
                hook["objectSelector"] = {
                    "matchExpressions": [{"key": f"{KUEUE_GROUP}/queue-name", "operator": "Exists"}]
                }
        kind = str(document["kind"]).lower().removesuffix("webhookconfiguration")
        document["metadata"] = {"name": f"{WEBHOOK_CONFIG_NAME}-{kind}"}
        document["webhooks"] = hooks
        configurations.append(document)
    return configurations


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _listening_addresses(pid: int) -> list[str]:
    """The local addresses the process listens on (TCP), as ``ss`` shows them."""
    listed = subprocess.run(
        ["ss", "-ltnpH"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [line.split()[3] for line in listed.splitlines() if f"pid={pid}," in line]


def _webhook_serving(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


def _wait_established(cluster: Cluster, plurals: list[str]) -> None:
    try:
        wait_established(cluster, [f"crd/{plural}.{KUEUE_GROUP}" for plural in plurals])
    except KubectlError as error:
        pytest.fail(f"Kueue's CRDs not Established: {error}", pytrace=False)


@pytest.fixture(scope="session")
def kueue(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    try:
        home = find_kueue()
    except BinariesMissingError as error:
        pytest.fail(f"Kueue {read_versions()['KUEUE_VERSION']} unavailable: {error}", pytrace=False)
    started = time.monotonic()
    _install_metrics_certificate()
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(home / "crds"))
    _wait_established(
        cluster, [path.stem.split("_", 1)[1] for path in (home / "crds").glob("*.yaml")]
    )
    kubectl(cluster, "create", "namespace", "kueue-system", check=False)
    state = tmp_path_factory.mktemp("kueue")
    certs = generate_webhook_certificates(state / "certs")
    ports = {name: _free_port() for name in ("health", "metrics", "webhook")}
    config_path = state / "config.yaml"
    config_path.write_text(yaml.safe_dump(_configuration(certs=state / "certs", ports=ports)))
    log_path = state / "kueue.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                str(home / "bin" / "kueue"),
                f"--config={config_path}",
                f"--kubeconfig={cluster.kubeconfig}",
                "--zap-log-level=info",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        )
    running = Kueue(cluster=cluster, process=process, log_path=log_path, startup_seconds=0.0)
    try:

        def ready() -> bool:
            running.assert_alive()
            return _ready(ports["health"]) and _webhook_serving(
                ports["webhook"], certs.ca_cert_path
            )

        wait_until_blocking(
            ready, timeout=STARTUP_TIMEOUT_SECONDS, what="Kueue to be ready", operator=running
        )
        listening = _listening_addresses(process.pid)
        exposed = [address for address in listening if not address.startswith("127.0.0.1:")]
        assert not exposed, f"Kueue listens beyond 127.0.0.1: {exposed}"
        expected = {f"127.0.0.1:{port}" for port in ports.values()}
        assert expected <= set(listening), (expected, listening)
        configurations = _webhook_configurations(
            home / "webhooks.yaml", port=ports["webhook"], ca=certs.ca_pem
        )
        running.apply(*configurations)
        running.apply(
            {
                "apiVersion": f"{KUEUE_GROUP}/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": DEFAULT_FLAVOR},
            }
        )
        running = Kueue(
            cluster=cluster,
            process=process,
            log_path=log_path,
            startup_seconds=time.monotonic() - started,
        )
        yield running
    finally:
        for kind in ("mutating", "validating"):
            kubectl(
                cluster,
                "delete",
                f"{kind}webhookconfiguration",
                f"{WEBHOOK_CONFIG_NAME}-{kind}",
                check=False,
            )
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
