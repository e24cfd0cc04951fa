"""Fixtures for ``flowforge server`` (the read API and the UI) against the real control plane
and PostgreSQL, with one operator: session-scoped, since starting them is most of the time
(the operator watches only its own two namespaces).

- ``tenancy``: namespaces A and B, each with the workflows below published; a
  ServiceAccount ``reader`` bound (Role + RoleBinding) in A only, and its real token from
  ``kubectl create token``.
- ``engine``: an operator watching A and B.
- ``api_server``: ``python -m flowforge.server`` on 127.0.0.1 as a ``flowforge_server``
  login granted every namespace, with the cluster's admin kubeconfig as its own
  credentials (it uses them only for reviews).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from psycopg.conninfo import make_conninfo

from flowforge.domain.validation import parse_definition
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.localdev.dev import bound_service_account
from flowforge.store import roles
from flowforge.store.connection import Pool
from flowforge.store.definitions import publish_definition
from flowforge.store.pool import open_pool
from tests.plugins.operator import OperatorProcess, fresh_namespace, wait_for_leader, wait_for_phase
from tests.plugins.postgres import (
    _create_database,
    _drop_database,
    dsn_for_database,
    ensure_login_role,
)
from tests.support.waiting import wait_until_blocking

SERVER_LOGIN = "ff_test_api_server"
QUICK = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
SLOW = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "60s"}}
FAIL = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-exit-code": "3"}}
DIAMOND: dict[str, Any] = {
    "workflow": "diamond",
    "version": 1,
    "taskTypes": {"quick": QUICK, "slow": SLOW, "fail": FAIL},
    "tasks": [
        {"key": "a", "type": "quick"},
        {"key": "b", "type": "quick", "dependsOn": ["a"]},
        {"key": "c", "type": "quick", "dependsOn": ["a"]},
        {"key": "d", "type": "quick", "dependsOn": ["b", "c"]},
        {"key": "undo-a", "type": "quick", "compensateFor": "a"},
    ],
}
SLOW_FLOW: dict[str, Any] = {
    "workflow": "slow",
    "version": 1,
    "taskTypes": {"slow": SLOW},
    "tasks": [{"key": "wait", "type": "slow"}],
}
FAILING: dict[str, Any] = {
    "workflow": "failing",
    "version": 1,
    "taskTypes": {"quick": QUICK, "fail": FAIL},
    "tasks": [
        {"key": "reserve", "type": "quick"},
        {"key": "ship", "type": "fail", "dependsOn": ["reserve"]},
        {"key": "release", "type": "quick", "compensateFor": "reserve"},
    ],
}
READER_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["flowforge.io"],
        "resources": ["workflowruns", "workflowdefinitions"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {
        "apiGroups": ["flowforge.io"],
        "resources": ["workflowschedules"],
        "verbs": ["get", "list", "watch"],
    },
    # a person's actions about runs: the object, and the custom verbs admission checks
    {"apiGroups": ["flowforge.io"], "resources": ["workflowrunactions"], "verbs": ["create"]},
    {
        "apiGroups": ["flowforge.io"],
        "resources": ["workflowruns"],
        "verbs": ["pause", "recover", "approve"],
    },
    {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
]


def _lower(headers: Any) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in headers.items()}


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class ApiServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def request(
        self,
        path: str,
        *,
        token: str | None = None,
        method: str = "GET",
        timeout: float = 30,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """``body``: JSON (bytes as they are); ``headers``: instead of those the UI sends
        with a POST (``X-FlowForge-Request``, and the JSON content type with a body)."""
        sent = {"Authorization": f"Bearer {token}"} if token is not None else {}
        data = b"" if method == "POST" else None
        # what the UI sends; a cross-site POST cannot (server/app.py)
        usual = {"X-FlowForge-Request": "1"} if method == "POST" else {}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            usual["Content-Type"] = "application/json"
        sent.update(usual if headers is None else headers)
        request = urllib.request.Request(self.url + path, headers=sent, method=method, data=data)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return Response(answer.status, _lower(answer.headers), answer.read())
        except urllib.error.HTTPError as error:
            return Response(error.code, _lower(error.headers), error.read())


@dataclass(frozen=True)
class Tenancy:
    a: str
    b: str
    reader_token: str
    admin_dsn: str
    server_dsn: str
    pool: Pool
    kubeconfig: Path
    api: k8s.ApiClient


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def two_namespaces(kube_api: k8s.ApiClient, engine_crds: list[str]) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:6]
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(
            contextlib.contextmanager(fresh_namespace)(kube_api, f"api-a-{suffix}")
        )
        b = stack.enter_context(
            contextlib.contextmanager(fresh_namespace)(kube_api, f"api-b-{suffix}")
        )
        yield a, b


@pytest.fixture(scope="session")
def module_database(postgres_server_dsn: str, postgres_template: str) -> Iterator[str]:
    name = f"flowforge_api_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    _create_database(postgres_server_dsn, name, template=postgres_template)
    yield dsn_for_database(postgres_server_dsn, name)
    _drop_database(postgres_server_dsn, name)


def reader_token(
    cluster: Cluster,
    namespace: str,
    account: str = "reader",
    rules: list[dict[str, Any]] = READER_RULES,
) -> str:
    """A ServiceAccount in ``namespace`` bound to ``rules`` there, and its real token."""
    manifest = bound_service_account(account, namespace=namespace, rules=rules)
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    created = kubectl(cluster, "create", "token", account, "-n", namespace, "--duration=1h")
    return created.stdout.strip()


@pytest.fixture(scope="session")
async def tenancy(
    cluster: Cluster,
    kube_api: k8s.ApiClient,
    two_namespaces: tuple[str, str],
    module_database: str,
    postgres_server_dsn: str,
) -> AsyncIterator[Tenancy]:
    a, b = two_namespaces
    ensure_login_role(postgres_server_dsn, SERVER_LOGIN, member_of=roles.SERVER)
    with psycopg.connect(module_database, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO flowforge_reporting_grant (grantee, namespace) VALUES (%s, '*') "
            "ON CONFLICT DO NOTHING",
            (SERVER_LOGIN,),
        )
    pool = await open_pool(module_database, min_size=1, max_size=4)
    for namespace in (a, b):
        for spec in (DIAMOND, SLOW_FLOW, FAILING):
            await publish_definition(pool, namespace=namespace, definition=parse_definition(spec))
    try:
        yield Tenancy(
            a=a,
            b=b,
            reader_token=reader_token(cluster, a),
            admin_dsn=module_database,
            server_dsn=make_conninfo(module_database, user=SERVER_LOGIN, password=SERVER_LOGIN),
            pool=pool,
            kubeconfig=cluster.kubeconfig,
            api=kube_api,
        )
    finally:
        await pool.close()


@pytest.fixture(scope="session")
async def engine(
    tenancy: Tenancy, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[OperatorProcess]:
    process = OperatorProcess(
        dsn=tenancy.admin_dsn,
        kubeconfig=tenancy.kubeconfig,
        namespace=f"{tenancy.a},{tenancy.b}",
        identity="api-operator",
        log_path=tmp_path_factory.mktemp("api-operator") / "operator.log",
    )
    process.start()
    try:
        await wait_for_leader(tenancy.pool, process.identity, process=process)
        yield process
    finally:
        process.stop()


@contextlib.contextmanager
def started_api_server(tenancy: Tenancy, log_path: Path, *extra: str) -> Iterator[ApiServer]:
    """``python -m flowforge.server`` on a free loopback port, stopped afterwards."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "flowforge.server",
        "--dsn",
        tenancy.server_dsn,
        "--kubeconfig",
        str(tenancy.kubeconfig),
        "--port",
        str(port),
        "--poll-seconds",
        "0.2",
        *extra,
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=str(repo_root())
        )
    server = ApiServer(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)

    def healthy() -> bool:
        assert process.poll() is None, f"flowforge server exited:\n{server.log_tail()}"
        try:
            return server.request("/healthz", timeout=2).status == 200
        except OSError:
            return False

    try:
        wait_until_blocking(healthy, timeout=60, what="flowforge server to start", operator=server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="session")
def api_server(tenancy: Tenancy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    log_path = tmp_path_factory.mktemp("api-server") / "server.log"
    with started_api_server(tenancy, log_path) as server:
        yield server


async def wait_phase(
    api: k8s.ApiClient, namespace: str, name: str, phases: set[str], *, timeout: float = 60
) -> dict[str, Any]:
    custom = k8s.CustomObjectsApi(api)
    return await wait_for_phase(
        lambda: custom.get_namespaced_custom_object(
            "flowforge.io", "v1alpha1", namespace, "workflowruns", name
        ),
        run=f"{namespace}/{name}",
        phases=phases,
        timeout=timeout,
    )


def create_run(api: k8s.ApiClient, namespace: str, name: str, workflow: str) -> dict[str, Any]:
    body: dict[str, Any] = k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        "flowforge.io",
        "v1alpha1",
        namespace,
        "workflowruns",
        {
            "apiVersion": "flowforge.io/v1alpha1",
            "kind": "WorkflowRun",
            "metadata": {"name": name},
            "spec": {"workflow": workflow, "version": 1},
        },
    )
    return body
