"""The local control plane: loopback only, a usable fake node, and kwok stages that
turn Jobs into successes, chosen failures and delayed completions."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from flowforge.localdev.binaries import BinariesMissingError, find_bin_dir
from flowforge.localdev.controlplane import (
    Cluster,
    cluster_status,
    kubectl,
    kubectl_json,
    start_cluster,
    stop_cluster,
)

pytestmark = pytest.mark.cluster

EXIT_CODE_ANNOTATION = "flowforge.io/simulate-exit-code"
DURATION_ANNOTATION = "flowforge.io/simulate-duration"


def _job(name: str, annotations: dict[str, str] | None = None) -> str:
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "task", "image": "example.invalid/task:1"}],
                },
            },
        },
    }
    return json.dumps(manifest)


def _run_job(cluster: Cluster, namespace: str, name: str, annotations: dict[str, str]) -> None:
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=_job(name, annotations))


def _wait_job(cluster: Cluster, namespace: str, name: str, condition: str) -> None:
    kubectl(
        cluster,
        "wait",
        "-n",
        namespace,
        f"--for=condition={condition}",
        f"job/{name}",
        "--timeout=90s",
        timeout=120,
    )


def _job_pod(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    pods = kubectl_json(cluster, "get", "pods", "-n", namespace, "-l", f"job-name={job}")
    assert len(pods["items"]) == 1, pods["items"]
    pod: dict[str, Any] = pods["items"][0]
    return pod


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_node_is_ready_untainted_on_loopback(cluster: Cluster) -> None:
    node = kubectl_json(cluster, "get", "node", cluster.node_name)
    addresses = {item["type"]: item["address"] for item in node["status"]["addresses"]}
    conditions = {item["type"]: item["status"] for item in node["status"]["conditions"]}
    assert addresses["InternalIP"] == "127.0.0.1"
    assert conditions["Ready"] == "True"
    assert not node["spec"].get("taints")
    assert cluster.server.startswith("https://127.0.0.1:")


def _listening_addresses(pid: int) -> set[str]:
    """host:port of every TCP socket the process listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = fd.readlink().as_posix() if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    listening = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A is LISTEN
                continue
            host_hex, port_hex = fields[1].split(":")
            if width == 8:
                host = ".".join(str(b) for b in reversed(bytes.fromhex(host_hex)))
            else:
                host = f"ipv6:{host_hex}"
            listening.add(f"{host}:{int(port_hex, 16)}")
    return listening


def test_every_component_listens_on_loopback_only(cluster: Cluster) -> None:
    status = cluster_status(cluster.state_dir)
    assert status.ready
    assert set(status.components) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok-controller",
    }
    assert all(status.components.values()), status.components
    pids = _component_pids(cluster)
    for component, pid in pids.items():
        addresses = _listening_addresses(pid)
        assert addresses, f"{component} listens nowhere"
        assert all(address.startswith("127.0.0.1:") for address in addresses), (
            component,
            addresses,
        )
    apiserver_addresses = _listening_addresses(pids["kube-apiserver"])
    assert f"127.0.0.1:{cluster.ports.apiserver}" in apiserver_addresses


def _component_pids(cluster: Cluster) -> dict[str, int]:
    pid_dir = cluster.state_dir / "kwok" / "clusters" / "flowforge" / "pids"
    return {path.stem: int(path.read_text()) for path in pid_dir.glob("*.pid")}


def test_a_plain_job_succeeds(cluster: Cluster, namespace: str) -> None:
    _run_job(cluster, namespace, "plain", {})
    _wait_job(cluster, namespace, "plain", "Complete")
    pod = _job_pod(cluster, namespace, "plain")
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["spec"]["nodeName"] == cluster.node_name
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0


def test_the_failure_annotation_fails_the_job_with_the_chosen_exit_code(
    cluster: Cluster, namespace: str
) -> None:
    _run_job(cluster, namespace, "doomed", {EXIT_CODE_ANNOTATION: "42"})
    _wait_job(cluster, namespace, "doomed", "Failed")
    pod = _job_pod(cluster, namespace, "doomed")
    assert pod["status"]["phase"] == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 42
    assert terminated["reason"] == "Error"


def test_exit_code_zero_counts_as_success(cluster: Cluster, namespace: str) -> None:
    _run_job(cluster, namespace, "zero", {EXIT_CODE_ANNOTATION: "0"})
    _wait_job(cluster, namespace, "zero", "Complete")
    terminated = _job_pod(cluster, namespace, "zero")["status"]["containerStatuses"][0]["state"]
    assert terminated["terminated"]["exitCode"] == 0


def test_the_duration_annotation_delays_completion(cluster: Cluster, namespace: str) -> None:
    _run_job(cluster, namespace, "slow", {DURATION_ANNOTATION: "4s"})
    _run_job(cluster, namespace, "quick", {})
    _wait_job(cluster, namespace, "quick", "Complete")
    slow = kubectl_json(cluster, "get", "job", "slow", "-n", namespace)
    assert not slow["status"].get("succeeded"), "the delayed Job finished before the quick one"
    _wait_job(cluster, namespace, "slow", "Complete")
    pod = _job_pod(cluster, namespace, "slow")
    started = _timestamp(pod["status"]["startTime"])
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    finished = _timestamp(terminated["finishedAt"])
    # timestamps have whole seconds: a 4 s delay shows as at least 4 s between them
    assert (finished - started).total_seconds() >= 4


def test_a_delayed_failure_keeps_its_exit_code(cluster: Cluster, namespace: str) -> None:
    _run_job(cluster, namespace, "late", {EXIT_CODE_ANNOTATION: "7", DURATION_ANNOTATION: "2s"})
    _wait_job(cluster, namespace, "late", "Failed")
    pod = _job_pod(cluster, namespace, "late")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 7
    started = _timestamp(pod["status"]["startTime"])
    assert (_timestamp(terminated["finishedAt"]) - started).total_seconds() >= 2


def test_cli_status_reports_the_running_cluster(cluster: Cluster) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowforge.localdev.controlplane",
            "status",
            "--dir",
            str(cluster.state_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    assert f"server {cluster.server}: ready" in completed.stdout
    assert f"KUBECONFIG={cluster.kubeconfig}" in completed.stdout


def test_a_second_cluster_runs_beside_the_first(cluster: Cluster, tmp_path: Path) -> None:
    second = start_cluster(state_dir=tmp_path / "second", bin_dir=cluster.bin_dir)
    try:
        assert set(second.ports.as_dict().values()).isdisjoint(cluster.ports.as_dict().values())
        assert second.server != cluster.server
        kubectl(second, "create", "namespace", "only-in-second")
        on_first = kubectl(cluster, "get", "namespace", "only-in-second", check=False)
        assert on_first.returncode != 0
        assert start_cluster(state_dir=tmp_path / "second") == second  # idempotent
    finally:
        stop_cluster(tmp_path / "second")
    assert cluster_status(tmp_path / "second").cluster is None
    assert not any(cluster_status(tmp_path / "second").components.values())
    assert kubectl(cluster, "get", "--raw", "/readyz").stdout.strip() == "ok"


def test_missing_binaries_name_the_build_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    (tmp_path / "etcd").chmod(0o755)
    monkeypatch.setenv("FLOWFORGE_CONTROLPLANE_BIN", str(tmp_path))
    with pytest.raises(BinariesMissingError) as raised:
        find_bin_dir()
    message = str(raised.value)
    assert "deploy/local/build.sh" in message
    assert "kube-apiserver" in message
    assert "etcd," not in message
