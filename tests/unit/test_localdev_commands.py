"""``make dev`` starts the webhooks, the operator and the read API with their DSN in the
environment, never on the command line (which ``ps`` shows every user of the machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowforge.localdev.cluster import Cluster
from flowforge.localdev.dev import (
    _child_environment,
    operator_command,
    server_command,
    webhook_command,
)
from flowforge.localdev.kwokconfig import ClusterPorts

DSN = "host=127.0.0.1 port=5432 user=flowforge_operator_login password=s3cret dbname=flowforge"


def local_cluster(state_dir: Path) -> Cluster:
    return Cluster(
        state_dir=state_dir,
        kubeconfig=state_dir / "kubeconfig",
        server="https://127.0.0.1:6443",
        bin_dir=state_dir / "bin",
        ports=ClusterPorts(*range(6443, 6449)),
        node_name="kwok-node-0",
        kube_version="v1.31.0",
        startup_seconds=1.0,
    )


def test_no_component_gets_its_dsn_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWFORGE_SERVER_DSN", "host=elsewhere user=stale")
    cluster = local_cluster(tmp_path)
    commands = {
        "webhooks": webhook_command(tmp_path, cluster, port=9443),
        "operator": operator_command(cluster),
        "server": server_command(cluster, port=8080),
    }
    for name, argv in commands.items():
        assert "--dsn" not in argv, name
        assert not [arg for arg in argv if "password" in arg or "host=" in arg], (name, argv)
        assert str(cluster.kubeconfig) in argv, name

    env = _child_environment(cluster, DSN)
    assert env["FLOWFORGE_DSN"] == DSN  # what each of the three reads without --dsn
    assert "FLOWFORGE_SERVER_DSN" not in env  # the server would read it first
