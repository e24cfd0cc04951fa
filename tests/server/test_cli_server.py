"""The CLI through ``flowforge server`` for a namespace user with no DSN: ``get runs``,
``describe run`` (and ``--watch``), ``graph RUN`` and ``logs`` with the kubeconfig's token as
kubectl would send it; the admin mode (``--admin --dsn``) still reads the store directly."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowforge.cli.main import main
from flowforge.localdev.controlplane import Cluster
from tests.plugins.api_server import ApiServer, Tenancy, create_run, wait_phase

pytestmark = pytest.mark.cluster


def user_kubeconfig(cluster: Cluster, token: str, namespace: str, path: Path) -> Path:
    """A kubeconfig whose current context is the ServiceAccount's token (no certificate)."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "reader", "user": {"token": token}}],
        "contexts": [
            {
                "name": "reader",
                "context": {
                    "cluster": admin["clusters"][0]["name"],
                    "user": "reader",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "reader",
    }
    path.write_text(yaml.safe_dump(document))
    return path


async def test_a_namespace_user_reads_runs_through_the_server_without_a_dsn(
    api_server: ApiServer,
    tenancy: Tenancy,
    engine: object,
    cluster: Cluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLOWFORGE_DSN", raising=False)
    monkeypatch.setenv("FLOWFORGE_CONFIG", str(tmp_path / "none.yaml"))
    kubeconfig = user_kubeconfig(cluster, tenancy.reader_token, tenancy.a, tmp_path / "kc")
    options = ["--server", api_server.url, "--kubeconfig", str(kubeconfig)]

    async def cli(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, [*argv, *options])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    create_run(tenancy.api, tenancy.a, "cli-a", "failing")
    # --watch follows it live until it ends (it may still be Pending in the store)
    for _ in range(100):
        code, out, err = await cli("runs", "show", "cli-a", "--watch")
        if code == 0:
            break
        assert "no run" in err, err
        await asyncio.sleep(0.2)
    assert code == 0, err
    assert out.startswith(f"Run:        {tenancy.a}/cli-a")
    assert "run cli-a: Failed (1/2)" in out.splitlines()[-1], out
    assert any(line.split()[1:] == ["ship", "failed"] for line in out.splitlines()), out
    await wait_phase(tenancy.api, tenancy.a, "cli-a", {"Failed"})

    code, out, err = await cli("runs", "show", "cli-a")
    assert code == 0, err
    assert "Phase:      Failed" in out and "Compensation (Completed" in out
    ship = next(line for line in out.splitlines() if line.startswith("ship"))
    assert ship.split()[1:5] == ["failed", "1", ship.split()[3], "3"], ship

    code, out, err = await cli("get", "runs")
    assert code == 0, err
    assert out.splitlines()[0].split()[:4] == ["NAME", "WORKFLOW", "VERSION", "PHASE"]
    assert any(line.split()[:4] == ["cli-a", "failing", "1", "Failed"] for line in out.splitlines())

    code, out, err = await cli("graph", "cli-a")
    assert code == 0, err
    assert 't_ship["ship (failed)"]' in out and "release" in out
    # the same drawing as the administrator's, from the store
    admin = ["--admin", "--dsn", tenancy.admin_dsn]
    assert (await cli("graph", "cli-a", *admin))[1] == out

    code, out, err = await cli("logs", "cli-a", "ship")
    # kwok runs no containers, so the apiserver has no log to give: the server says so
    assert code == 1 and err.startswith("flowforge logs: ship attempt 1: server: "), err
    assert len(err.splitlines()) == 1

    code, _, err = await cli("runs", "show", "diamond-b", "-n", tenancy.b)
    assert code == 1 and "may not" in err and tenancy.b in err, err
    code, _, err = await cli("logs", "cli-a", "-n", tenancy.b)
    assert code == 1 and "server:" in err, err

    # an administrator's DSN reads the store itself
    code, out, err = await cli(
        "get", "runs", "cli-a", "--admin", "--dsn", tenancy.admin_dsn, "-n", tenancy.a
    )
    assert code == 0, err
    assert out.splitlines()[1].split()[:4] == ["cli-a", "failing", "1", "Failed"]
    monkeypatch.setenv("FLOWFORGE_TOKEN", "not-a-token")
    code, _, err = await cli("get", "runs")
    assert code == 1 and "not valid" in err, err
