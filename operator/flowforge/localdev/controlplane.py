"""A real Kubernetes control plane as local processes, for tests and development.

kwokctl (binary runtime) starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the kwok controller from the binaries built by
deploy/local/build.sh, all bound to 127.0.0.1 on ports we choose, with their state
in a folder of ours. We then register one untainted fake Node (InternalIP
127.0.0.1) and wait until the cluster can run a Job.

    python -m flowforge.localdev.controlplane up|down|status [--dir DIR] [--build]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flowforge.localdev.apiclient import JsonObject, LocalApiClient
from flowforge.localdev.binaries import find_bin_dir, read_versions
from flowforge.localdev.cluster import CLUSTER_NAME, cluster_workdir, kwok_workdir
from flowforge.localdev.cluster import Cluster as Cluster
from flowforge.localdev.cluster import KubectlError as KubectlError
from flowforge.localdev.cluster import kubectl as kubectl
from flowforge.localdev.cluster import kubectl_json as kubectl_json
from flowforge.localdev.kwokconfig import (
    ADMISSION_DIR,
    LOOPBACK,
    ClusterPorts,
    pick_free_ports,
    write_admission_configuration,
    write_config,
)

NODE_NAME = "flowforge-node"
STATE_FILE = "cluster.json"
DEFAULT_STATE_DIR = Path.home() / ".cache" / "flowforge" / "clusters" / "default"
START_ATTEMPTS = 3
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok-controller",
)


class ClusterError(RuntimeError):
    """The local cluster could not be started, found or stopped."""


def _kwokctl(bin_dir: Path, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KWOK_WORKDIR": str(kwok_workdir(state_dir))}
    return subprocess.run(
        [
            str(bin_dir / "kwokctl"),
            *args,
            "--name",
            CLUSTER_NAME,
            "--kubeconfig",
            str(state_dir / "kubeconfig"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _answers(cluster: Cluster) -> bool:
    return cluster.kubeconfig.exists() and LocalApiClient(cluster.kubeconfig).is_ready()


def load_cluster(state_dir: Path) -> Cluster | None:
    """The cluster recorded in state_dir, whether or not it still runs."""
    state_file = state_dir / STATE_FILE
    if not state_file.exists():
        return None
    return Cluster.from_json(json.loads(state_file.read_text()))


def start_cluster(
    *,
    state_dir: Path,
    bin_dir: Path | None = None,
    timeout: float = 180.0,
    controller_manager_qps: int | None = None,
    extra_stages: Sequence[Path] = (),
) -> Cluster:
    """Start a cluster whose state lives in state_dir and wait until it can run Jobs.

    Idempotent: a cluster already running from state_dir is returned as is; a stale
    one (processes gone) is cleaned up first. Several clusters with distinct
    state_dirs run side by side. ``extra_stages``: files of further kwok Stages (a benchmark's
    own Pod outcomes) appended to FlowForge's.
    """
    state_dir = state_dir.resolve()
    existing = load_cluster(state_dir)
    if existing is not None:
        if _answers(existing):
            return existing
        stop_cluster(state_dir)
    binaries = bin_dir or find_bin_dir()
    versions = read_versions()
    state_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, START_ATTEMPTS + 1):
        started = time.monotonic()
        ports = pick_free_ports()
        _create(
            state_dir=state_dir,
            bin_dir=binaries,
            ports=ports,
            versions=versions,
            controller_manager_qps=controller_manager_qps,
            extra_stages=extra_stages,
        )
        try:
            client = _wait_until_ready(state_dir, deadline=started + timeout)
        except ClusterError:
            port_clash = _logs_mention(state_dir, "address already in use")
            stop_cluster(state_dir)
            if port_clash and attempt < START_ATTEMPTS:
                continue
            raise
        cluster = Cluster(
            state_dir=state_dir,
            kubeconfig=state_dir / "kubeconfig",
            server=client.server,
            bin_dir=binaries,
            ports=ports,
            node_name=NODE_NAME,
            kube_version=versions["KUBE_VERSION"],
            startup_seconds=round(time.monotonic() - started, 2),
        )
        (state_dir / STATE_FILE).write_text(json.dumps(cluster.to_json(), indent=2) + "\n")
        return cluster
    raise ClusterError("unreachable")  # pragma: no cover


def _create(
    *,
    state_dir: Path,
    bin_dir: Path,
    ports: ClusterPorts,
    versions: dict[str, str],
    controller_manager_qps: int | None,
    extra_stages: Sequence[Path],
) -> None:
    config = state_dir / "kwokctl.yaml"
    admission_configuration, _ = write_admission_configuration(state_dir / ADMISSION_DIR)
    write_config(
        config,
        bin_dir=bin_dir,
        ports=ports,
        kube_version=versions["KUBE_VERSION"],
        kwok_version=versions["KWOK_VERSION"],
        admission_configuration=admission_configuration,
        controller_manager_qps=controller_manager_qps,
        extra_stages=extra_stages,
    )
    completed = _kwokctl(bin_dir, state_dir, "--config", str(config), "create", "cluster")
    if completed.returncode != 0:
        stop_cluster(state_dir)
        raise ClusterError(f"kwokctl create cluster failed: {completed.stderr.strip()[-2000:]}")


def _wait_until_ready(state_dir: Path, *, deadline: float) -> LocalApiClient:
    """Block until the apiserver is ready, the Node is Ready and untainted, the
    scheduler and controller-manager hold their leases and the default
    ServiceAccount exists (so a Pod can be admitted and bound)."""
    kubeconfig = state_dir / "kubeconfig"
    while not kubeconfig.exists():
        _check_deadline(state_dir, deadline, "kubeconfig to be written")
        time.sleep(0.1)
    client = LocalApiClient(kubeconfig)
    while not client.is_ready():
        _check_deadline(state_dir, deadline, "kube-apiserver /readyz")
        time.sleep(0.2)
    client.create("/api/v1/nodes", _node_manifest())
    pending = ["node", "leases", "serviceaccount"]
    while pending:
        pending = [check for check in pending if not _ready(client, check)]
        if pending:
            _check_deadline(state_dir, deadline, ", ".join(pending))
            time.sleep(0.2)
    return client


def _ready(client: LocalApiClient, check: str) -> bool:
    if check == "node":
        node = client.get_json(f"/api/v1/nodes/{NODE_NAME}") or {}
        conditions = node.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        return ready and not node.get("spec", {}).get("taints")
    if check == "leases":
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
        return all(
            client.get_json(f"{leases}/{name}") is not None
            for name in ("kube-scheduler", "kube-controller-manager")
        )
    return client.get_json("/api/v1/namespaces/default/serviceaccounts/default") is not None


def _node_manifest() -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE_NAME,
            "labels": {
                "kubernetes.io/hostname": NODE_NAME,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": LOOPBACK},
                {"type": "Hostname", "address": NODE_NAME},
            ],
            "allocatable": {"cpu": "1k", "memory": "1Ti", "pods": "1M"},
            "capacity": {"cpu": "1k", "memory": "1Ti", "pods": "1M"},
        },
    }


def _check_deadline(state_dir: Path, deadline: float, waiting_for: str) -> None:
    if time.monotonic() < deadline:
        return
    raise ClusterError(f"timed out waiting for {waiting_for}\n{_log_tails(state_dir)}")


def _log_tails(state_dir: Path, lines: int = 15) -> str:
    parts = []
    for component in COMPONENTS:
        log = cluster_workdir(state_dir) / "logs" / f"{component}.log"
        if log.exists():
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log}\n" + "\n".join(tail))
    return "\n".join(parts)


def _logs_mention(state_dir: Path, text: str) -> bool:
    logs = cluster_workdir(state_dir) / "logs"
    return logs.exists() and any(
        text in log.read_text(errors="replace") for log in logs.glob("*.log")
    )


def _component_pids(state_dir: Path) -> dict[str, int]:
    pids: dict[str, int] = {}
    for pid_file in (cluster_workdir(state_dir) / "pids").glob("*.pid"):
        content = pid_file.read_text().strip()
        if content.isdigit():
            pids[pid_file.stem] = int(content)
    return pids


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie awaiting its reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_cluster(state_dir: Path, *, grace_seconds: float = 10.0) -> None:
    """Stop the cluster of state_dir and remove its state; a no-op when none runs."""
    state_dir = state_dir.resolve()
    pids = _component_pids(state_dir)
    kwokctl_dir = _recorded_or_found_bin_dir(state_dir)
    if kwokctl_dir is not None and cluster_workdir(state_dir).exists():
        _kwokctl(kwokctl_dir, state_dir, "delete", "cluster")
    # kwokctl signals the components; make sure they are gone before reusing ports.
    deadline = time.monotonic() + grace_seconds
    for pid in pids.values():
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(kwok_workdir(state_dir), ignore_errors=True)
    shutil.rmtree(state_dir / "kubectl-cache", ignore_errors=True)
    for leftover in (STATE_FILE, "kubeconfig", "kwokctl.yaml"):
        (state_dir / leftover).unlink(missing_ok=True)
    shutil.rmtree(state_dir / ADMISSION_DIR, ignore_errors=True)


def _recorded_or_found_bin_dir(state_dir: Path) -> Path | None:
    recorded = load_cluster(state_dir)
    if recorded is not None:
        return recorded.bin_dir
    try:
        return find_bin_dir()
    except RuntimeError:
        return None


@dataclass(frozen=True)
class ClusterStatus:
    cluster: Cluster | None
    ready: bool
    components: dict[str, bool]


def cluster_status(state_dir: Path) -> ClusterStatus:
    state_dir = state_dir.resolve()
    cluster = load_cluster(state_dir)
    components = {name: _alive(pid) for name, pid in _component_pids(state_dir).items()}
    ready = cluster is not None and _answers(cluster)
    return ClusterStatus(cluster=cluster, ready=ready, components=components)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flowforge.localdev.controlplane",
        description="Start, stop or inspect the local Kubernetes control plane.",
    )
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"state folder of the cluster (default {DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--build",
        action="store_true",
        help="build missing binaries with deploy/local/build.sh first",
    )
    options = parser.parse_args(argv)
    try:
        if options.command == "up":
            bin_dir = find_bin_dir(build=options.build)
            cluster = start_cluster(state_dir=options.dir, bin_dir=bin_dir)
            print(f"cluster ready in {cluster.startup_seconds:.1f} s at {cluster.server}")
            print(f"ports: {json.dumps(cluster.ports.as_dict())}")
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif options.command == "down":
            stop_cluster(options.dir)
            print(f"cluster in {options.dir.resolve()} stopped")
        else:
            status = cluster_status(options.dir)
            if status.cluster is None:
                print(f"no cluster recorded in {options.dir.resolve()}")
                return 1
            print(f"server {status.cluster.server}: {'ready' if status.ready else 'NOT ready'}")
            for name, alive in sorted(status.components.items()):
                print(f"  {name}: {'running' if alive else 'stopped'}")
            print(f"export KUBECONFIG={status.cluster.kubeconfig}")
            return 0 if status.ready else 1
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
