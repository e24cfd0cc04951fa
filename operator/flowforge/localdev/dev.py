"""``make dev``: FlowForge running locally against a real control plane, in one command.

    python -m flowforge.localdev.dev up   [--dir DIR] [--no-examples]
    python -m flowforge.localdev.dev down [--dir DIR]

``up`` starts (or reuses) a PostgreSQL server and the local cluster, installs the CRDs,
migrates the store, starts the admission webhook server and the operator as background
processes, registers the webhooks, applies ``examples/`` and waits for the example runs to
reach their expected phases. Every step says what it does and how long it took, and ``up``
is idempotent: what already runs is reused. ``down`` stops every process it started and
removes the cluster; nothing is left running.

State lives in DIR (default ``/tmp/flowforge-dev``: the PostgreSQL server runs as an
unprivileged account, which must be able to reach the folder).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowforge.domain.api import DEFINITION_CRD, RUN_CRD, RUN_PLURAL
from flowforge.domain.states import TERMINAL_RUN_PHASES, RunPhase
from flowforge.localdev import postgres
from flowforge.localdev.binaries import find_bin_dir, repo_root
from flowforge.localdev.cluster import wait_established
from flowforge.localdev.controlplane import (
    Cluster,
    kubectl,
    kubectl_json,
    load_cluster,
    start_cluster,
    stop_cluster,
)

DEFAULT_DIR = Path(os.environ.get("FLOWFORGE_DEV_DIR", "/tmp/flowforge-dev"))
WEBHOOK_PORT_FILE = "webhook.port"
SERVER_PORT_FILE = "server.port"
DEV_USER = "dev-user"
# what the printed `kubectl create token` user may do in the default namespace: read runs
# and definitions, cancel and retry, read their Pods' logs
DEV_USER_RULES = [
    {
        "apiGroups": ["flowforge.io"],
        "resources": ["workflowruns", "workflowdefinitions"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
]


@dataclass(frozen=True)
class ExampleRun:
    name: str
    expected_phase: RunPhase


# What each example must end as: the diamond succeeds, the saga's failing step rolls back.
EXAMPLE_RUNS = (
    ExampleRun("etl-2026-11-30", RunPhase.SUCCEEDED),
    ExampleRun("order-1001", RunPhase.FAILED),
)


class DevError(RuntimeError):
    """A step of ``make dev`` failed; the message names the step and where to look."""


@contextmanager
def step(title: str) -> Iterator[None]:
    print(f"==> {title}", flush=True)
    started = time.monotonic()
    yield
    print(f"    done in {time.monotonic() - started:.1f} s", flush=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running_pid(pid_file: Path) -> int | None:
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text().strip() or 0)
    return pid if pid and _pid_alive(pid) else None


def _port_of(state_dir: Path, name: str, *, port_file: str) -> int:
    """The port the background process ``name`` listens on: kept while it runs, else new."""
    path = state_dir / port_file
    running = _running_pid(state_dir / f"{name}.pid")
    port = int(path.read_text()) if running and path.exists() else _free_port()
    path.write_text(f"{port}\n")
    return port


def _start_background(
    name: str, command: list[str], *, state_dir: Path, env: dict[str, str]
) -> int:
    """Start ``command`` detached, logging to DIR/NAME.log; reuse one that already runs."""
    pid_file = state_dir / f"{name}.pid"
    running = _running_pid(pid_file)
    if running is not None:
        print(f"    {name} already running (pid {running})")
        return running
    log = (state_dir / f"{name}.log").open("ab")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    pid_file.write_text(f"{process.pid}\n")
    print(f"    {name} started (pid {process.pid}, log {state_dir / f'{name}.log'})")
    return process.pid


def _stop_background(name: str, *, state_dir: Path, grace_seconds: float = 10.0) -> None:
    pid_file = state_dir / f"{name}.pid"
    pid = _running_pid(pid_file)
    if pid is not None:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
        print(f"    stopped {name} (pid {pid})")
    pid_file.unlink(missing_ok=True)


def _wait_for_port(port: int, *, what: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise DevError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s; see {log}")


def _child_environment(cluster: Cluster, dsn: str) -> dict[str, str]:
    """A component's environment: its DSN is ``FLOWFORGE_DSN``, which each of them reads,
    never an argument (``ps`` shows every user the command lines)."""
    env = dict(os.environ)
    env.update({"KUBECONFIG": str(cluster.kubeconfig), "FLOWFORGE_DSN": dsn})
    env.pop("FLOWFORGE_SERVER_DSN", None)  # the server would prefer it to FLOWFORGE_DSN
    env.setdefault("MALLOC_ARENA_MAX", "2")  # as the image and the chart set it
    env["PATH"] = f"{cluster.bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def webhook_command(state_dir: Path, cluster: Cluster, *, port: int) -> list[str]:
    return [
        *_python_module("flowforge.admission.server", cluster),
        *("--port", str(port), "--certs", str(state_dir / "certs")),
        *("--client-ca", str(cluster.webhook_client.ca_cert_path)),
    ]


def operator_command(cluster: Cluster) -> list[str]:
    return [*_python_module("flowforge.operator", cluster), "--job-ttl", "-1"]


def server_command(cluster: Cluster, *, port: int) -> list[str]:
    return [*_python_module("flowforge.server", cluster), "--port", str(port)]


def _python_module(module: str, cluster: Cluster) -> list[str]:
    # no --dsn: the DSN is in the environment (``_child_environment``)
    return [sys.executable, "-m", module, "--kubeconfig", str(cluster.kubeconfig)]


def _wait_for_examples(cluster: Cluster, *, timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    phases: dict[str, str] = {}
    while time.monotonic() < deadline:
        listing = kubectl_json(cluster, "get", RUN_PLURAL, "-n", "default", "-o", "json")
        phases = {
            item["metadata"]["name"]: str(item.get("status", {}).get("phase", ""))
            for item in listing.get("items", [])
        }
        if all(phases.get(run.name) in TERMINAL_RUN_PHASES for run in EXAMPLE_RUNS):
            return phases
        time.sleep(1.0)
    raise DevError(f"example runs did not finish within {timeout:.0f} s: {phases}")


def up(state_dir: Path, *, apply_examples: bool = True) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o755)
    root = repo_root()
    with step("control plane binaries (first build takes ~15 min on 2 cores; cached after)"):
        bin_dir = find_bin_dir(build=True)
    with step("PostgreSQL"):
        server = postgres.start(state_dir / "postgres")
        print(f"    {server.dsn}")
    with step("local control plane (etcd, apiserver, controller-manager, scheduler, kwok)"):
        cluster = start_cluster(state_dir=state_dir / "cluster", bin_dir=bin_dir)
        print(f"    {cluster.server} (kubeconfig {cluster.kubeconfig})")
    with step("CRDs"):
        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(root / "crds"))
        wait_established(cluster, [f"crd/{DEFINITION_CRD}", f"crd/{RUN_CRD}"])
    with step("store roles (a login per component) and schema, migrated as the migrator"):
        from flowforge.store.migrate import migrate

        dsns = postgres.provision(server.dsn)
        report = asyncio.run(migrate(dsns["migrator"]))
        print(f"    schema version {report.schema_version}")
        _grant_every_namespace(dsns["migrator"], login=postgres.COMPONENT_LOGINS["server"][0])
    env = _child_environment(cluster, dsns["webhook"])
    with step("admission webhooks"):
        port = _port_of(state_dir, "webhooks", port_file=WEBHOOK_PORT_FILE)
        _start_background(
            "webhooks", webhook_command(state_dir, cluster, port=port), state_dir=state_dir, env=env
        )
        _wait_for_port(port, what="the webhook server", log=state_dir / "webhooks.log")
        from flowforge.admission.certs import WebhookCertificates
        from flowforge.kube.webhook_config import apply_webhook_configurations, local_endpoint

        certs = WebhookCertificates.in_directory(state_dir / "certs")
        endpoint = local_endpoint(port=port, ca_pem=certs.ca_cert_path.read_bytes())
        apply_webhook_configurations(endpoint, kubeconfig=cluster.kubeconfig)
    with step("operator"):
        _start_background(
            "operator",
            operator_command(cluster),
            state_dir=state_dir,
            env=_child_environment(cluster, dsns["operator"]),
        )
    with step("flowforge server (the read API and the web UI)"):
        server_url = _start_server(state_dir, cluster, dsns["server"])
        _apply_dev_user(cluster)
    if apply_examples:
        with step("examples (an ETL diamond; a saga whose failing step is rolled back)"):
            for example in sorted((root / "examples").glob("*.yaml")):
                _apply_with_retry(cluster, example)
            phases = _wait_for_examples(cluster, timeout=240.0)
            for run in EXAMPLE_RUNS:
                if phases.get(run.name) != run.expected_phase:
                    raise DevError(
                        f"run {run.name} ended {phases.get(run.name)!r}, "
                        f"expected {run.expected_phase!r}; see {state_dir / 'operator.log'}"
                    )
        print()
        print(kubectl(cluster, "get", RUN_PLURAL, "-A").stdout)
    _print_next_steps(state_dir, cluster, dsns, server_url=server_url)
    return 0


def _grant_every_namespace(migrator_dsn: str, *, login: str) -> None:
    """The server's login may read every namespace; each request narrows it (roles.py)."""
    import psycopg

    with psycopg.connect(migrator_dsn, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO flowforge_reporting_grant (grantee, namespace) VALUES (%s, '*') "
            "ON CONFLICT DO NOTHING",
            (login,),
        )


def _start_server(state_dir: Path, cluster: Cluster, dsn: str) -> str:
    port = _port_of(state_dir, "server", port_file=SERVER_PORT_FILE)
    _start_background(
        "server",
        server_command(cluster, port=port),
        state_dir=state_dir,
        env=_child_environment(cluster, dsn),
    )
    _wait_for_port(port, what="flowforge server", log=state_dir / "server.log")
    return f"http://127.0.0.1:{port}"


def _apply_dev_user(cluster: Cluster) -> None:
    """A ServiceAccount to sign in as: what it may do in ``default`` is DEV_USER_RULES."""
    import json

    manifest = bound_service_account(DEV_USER, namespace="default", rules=DEV_USER_RULES)
    kubectl(cluster, "apply", "-n", "default", "-f", "-", stdin=json.dumps(manifest))
    print(f"    ServiceAccount default/{DEV_USER} may read and act on the runs of default")


def bound_service_account(
    name: str, *, namespace: str, rules: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A ServiceAccount with a Role of ``rules`` bound to it in ``namespace`` (a List)."""
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": name},
                "rules": list(rules),
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": name},
                "roleRef": role,
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        ],
    }


def _apply_with_retry(cluster: Cluster, manifest: Path, *, attempts: int = 10) -> None:
    # Right after start the apiserver may not yet reach a webhook that just began listening.
    for attempt in range(attempts):
        result = kubectl(cluster, "apply", "-f", str(manifest), check=False)
        if result.returncode == 0:
            print(f"    {result.stdout.strip()}")
            return
        if attempt == attempts - 1:
            raise DevError(f"kubectl apply -f {manifest} failed: {result.stderr.strip()}")
        time.sleep(1.0)


def _print_next_steps(
    state_dir: Path, cluster: Cluster, dsns: dict[str, str], *, server_url: str
) -> None:
    print(
        f"flowforge server (API and UI): {server_url}\n"
        f"  sign in with a token: kubectl create token {DEV_USER} -n default\n"
        f"  flowforge get runs --server {server_url} --token-file <(kubectl create token "
        f"{DEV_USER})\n"
        "FlowForge is running locally. Next:\n"
        f"  export KUBECONFIG={cluster.kubeconfig} PATH={cluster.bin_dir}:$PATH\n"
        "  # the admin's DSN (the schema's owner); each process has its own role\n"
        f"  export FLOWFORGE_DSN='{dsns['migrator']}'\n"
        f"  FLOWFORGE_DSN='{dsns['retention']}' flowforge db prune --older-than 30d\n"
        "  kubectl get flowforge                    # definitions and runs\n"
        "  kubectl describe wfr order-1001          # conditions and events of the rollback\n"
        "  flowforge describe run order-1001 --admin  # the history, from PostgreSQL\n"
        "  kubectl apply -f examples/etl-diamond.yaml  # re-applying is a no-op\n"
        f"  logs: {state_dir}/operator.log, {state_dir}/webhooks.log, {state_dir}/server.log\n"
        "  make dev-down                            # stop everything"
    )


def down(state_dir: Path) -> int:
    with step("stopping FlowForge"):
        for name in ("server", "operator", "webhooks"):
            _stop_background(name, state_dir=state_dir)
        cluster_dir = state_dir / "cluster"
        if load_cluster(cluster_dir) is not None or cluster_dir.exists():
            stop_cluster(cluster_dir)
            print("    stopped the local cluster")
        if postgres.stop(state_dir / "postgres"):
            print("    stopped PostgreSQL")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowforge.localdev.dev")
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--no-examples", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            return up(args.dir.absolute(), apply_examples=not args.no_examples)
        return down(args.dir.absolute())
    except (DevError, postgres.PostgresSetupError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
