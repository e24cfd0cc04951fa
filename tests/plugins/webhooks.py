"""pytest fixtures for FlowForge's admission webhooks, served for real.

- ``webhook_server`` (session): `python -m flowforge.admission.server` in a subprocess
  on 127.0.0.1 with freshly generated certificates and a migrated database of its own. It
  needs the cluster (kopf discovers the resources there) and the CRDs.
- ``admission_webhooks`` (module): the Validating/MutatingWebhookConfigurations pointing the
  apiserver at that server, removed again after the module, so that cluster tests of other
  modules do not meet the webhooks unless they ask for them.
- ``store_webhooks``: a webhook server of its own on the operator's store, enforced.
- ``start_operator``: an operator on the webhook server's database.
- ``webhook_https``: POST raw AdmissionReview JSON to the server (for fuzzing), presenting
  the apiserver's client certificate, as the apiserver does; their author
  (``review_author``, session) may create and update FlowForge's kinds, cluster-wide, as
  the apiserver would have checked, and nothing more.

The server trusts only the CA of the cluster's webhook client certificate
(``Cluster.webhook_client``), so a client without that certificate fails the TLS handshake.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flowforge.admission.certs import (
    ClientCertificates,
    WebhookCertificates,
    generate_webhook_certificates,
)
from flowforge.domain.api import GROUP
from flowforge.kube.webhook_config import (
    VALIDATING_HANDLERS,
    apply_webhook_configurations,
    delete_webhook_configurations,
    local_endpoint,
)
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.connection import Pool
from flowforge.store.pool import open_pool
from tests.plugins.operator import OperatorProcess, wait_for_leader
from tests.plugins.postgres import _create_database, _drop_database, dsn_for_database
from tests.support.admission import SOMEONE
from tests.support.rbac import grant
from tests.support.waiting import wait_until_blocking

STARTUP_TIMEOUT_SECONDS = 60.0
REQUEST_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class WebhookServer:
    port: int
    certs: WebhookCertificates
    client: ClientCertificates
    dsn: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def assert_alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"webhook server exited with {code}:\n{self.log_tail()}"


@dataclass(frozen=True)
class HttpsResult:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookHttps:
    """A client trusting only the test CA, like the apiserver; with ``client`` it presents that
    certificate (the apiserver's), without it none."""

    def __init__(self, server: WebhookServer, *, client: ClientCertificates | None) -> None:
        self._server = server
        self._context = ssl.create_default_context(cafile=str(server.certs.ca_cert_path))
        if client is not None:
            self._context.load_cert_chain(client.cert_path, client.key_path)

    def post(
        self, handler_id: str, body: bytes, *, timeout: float = REQUEST_TIMEOUT_SECONDS
    ) -> HttpsResult:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self._server.port, context=self._context, timeout=timeout
        )
        try:
            connection.request(
                "POST", f"/{handler_id}", body=body, headers={"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            return HttpsResult(status=response.status, body=response.read())
        finally:
            connection.close()


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_serving(server: WebhookServer) -> None:
    https = WebhookHttps(server, client=server.client)

    def serving() -> bool:
        server.assert_alive()
        try:
            # Not JSON: a serving kopf answers 400 without touching any handler.
            https.post("validate-workflowdefinition", b"probe", timeout=5)
        except (OSError, http.client.HTTPException):
            return False
        return True

    wait_until_blocking(
        serving,
        timeout=STARTUP_TIMEOUT_SECONDS,
        what="the webhook server to serve",
        operator=server,
    )


# Passes the CRD schema, so only our webhook can refuse it.
_CYCLIC_DEFINITION = {
    "apiVersion": "flowforge.io/v1alpha1",
    "kind": "WorkflowDefinition",
    "metadata": {"name": "webhook-readiness-probe", "namespace": "default"},
    "spec": {
        "workflow": "probe",
        "version": 1,
        "taskTypes": {"t": {"image": "busybox"}},
        "tasks": [
            {"key": "a", "type": "t", "dependsOn": ["b"]},
            {"key": "b", "type": "t", "dependsOn": ["a"]},
        ],
    },
}


def _wait_until_enforced(cluster: Cluster, server: WebhookServer) -> None:
    """The apiserver picks up new webhook configurations asynchronously: wait for a denial."""
    answered = ""

    def denied() -> bool:
        nonlocal answered
        server.assert_alive()
        result = kubectl(
            cluster,
            "apply",
            "--dry-run=server",
            "-f",
            "-",
            stdin=json.dumps(_CYCLIC_DEFINITION),
            check=False,
        )
        answered = f"{result.stdout}{result.stderr}"
        return result.returncode != 0 and "dependency cycle" in result.stderr

    wait_until_blocking(
        denied,
        timeout=STARTUP_TIMEOUT_SECONDS,
        what=lambda: f"the apiserver to call the webhooks, it answered: {answered}",
        operator=server,
    )


@pytest.fixture(scope="session")
def webhook_store_dsn(postgres_server_dsn: str, postgres_template: str) -> Iterator[str]:
    """A migrated database that only the webhook server (and its tests) use."""
    name = f"flowforge_webhooks_{os.getpid()}"
    _create_database(postgres_server_dsn, name, template=postgres_template)
    try:
        yield dsn_for_database(postgres_server_dsn, name)
    finally:
        _drop_database(postgres_server_dsn, name)


def spawn_webhook_server(
    cluster: Cluster,
    *,
    directory: Path,
    dsn: str,
    kubeconfig: Path | None = None,
    command: Callable[[int, WebhookCertificates], list[str]] | None = None,
) -> WebhookServer:
    """`python -m flowforge.admission.server` (or ``command(port, certs)``) on a free
    port with new serving certificates in ``directory``, trusting the cluster's webhook client
    CA, until it serves."""
    certs = generate_webhook_certificates(directory / "certs")
    port = _free_port()
    log_path = directory / "webhook-server.log"
    launch = (
        command(port, certs)
        if command is not None
        else [
            sys.executable,
            "-m",
            "flowforge.admission.server",
            *("--port", str(port), "--certs", str(directory / "certs")),
            *("--client-ca", str(cluster.webhook_client.ca_cert_path)),
            *("--dsn", dsn, "--kubeconfig", str(kubeconfig or cluster.kubeconfig)),
        ]
    )
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            launch,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = WebhookServer(
        port=port,
        certs=certs,
        client=cluster.webhook_client,
        dsn=dsn,
        process=process,
        log_path=log_path,
    )
    try:
        _wait_until_serving(server)
    except BaseException:
        stop_webhook_server(server)
        raise
    return server


def stop_webhook_server(server: WebhookServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=5)


@contextlib.contextmanager
def webhooks_on_store(cluster: Cluster, *, directory: Path, dsn: str) -> Iterator[WebhookServer]:
    """A webhook server of its own on the store ``dsn`` (an operator's, whose published
    definitions admission then finds), enforced by the apiserver until the block ends."""
    server = spawn_webhook_server(cluster, directory=directory, dsn=dsn)
    try:
        endpoint = local_endpoint(port=server.port, ca_pem=server.certs.ca_pem)
        apply_webhook_configurations(endpoint, kubeconfig=cluster.kubeconfig)
        _wait_until_enforced(cluster, server)
        yield server
    finally:
        delete_webhook_configurations(kubeconfig=cluster.kubeconfig)
        stop_webhook_server(server)


@pytest.fixture(scope="session")
def webhook_server(
    cluster: Cluster,
    flowforge_crds: list[str],
    webhook_store_dsn: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WebhookServer]:
    directory = tmp_path_factory.mktemp("webhooks")
    server = spawn_webhook_server(cluster, directory=directory, dsn=webhook_store_dsn)
    try:
        yield server
    finally:
        stop_webhook_server(server)


@contextlib.contextmanager
def _enforced(cluster: Cluster, server: WebhookServer) -> Iterator[WebhookServer]:
    """The apiserver calls ``server`` for FlowForge's kinds until the block ends."""
    endpoint = local_endpoint(port=server.port, ca_pem=server.certs.ca_pem)
    apply_webhook_configurations(endpoint, kubeconfig=cluster.kubeconfig)
    try:
        _wait_until_enforced(cluster, server)
        yield server
    finally:
        delete_webhook_configurations(kubeconfig=cluster.kubeconfig)


@pytest.fixture(scope="module")
def admission_webhooks(cluster: Cluster, webhook_server: WebhookServer) -> Iterator[WebhookServer]:
    with _enforced(cluster, webhook_server):
        yield webhook_server


@pytest.fixture
def store_webhooks(cluster: Cluster, store_dsn: str, tmp_path: Path) -> Iterator[WebhookServer]:
    """The webhooks on the operator's store (not a database of their own), enforced by the
    apiserver, for a test whose operator and admission must see the same runs."""
    with webhooks_on_store(cluster, directory=tmp_path, dsn=store_dsn) as server:
        yield server


async def start_operator(
    operators: Callable[..., OperatorProcess], webhook_store: Pool, server: WebhookServer
) -> OperatorProcess:
    """An operator on the webhook server's database, so both see the same store."""
    process = operators(dsn=server.dsn)
    await wait_for_leader(webhook_store, process.identity, process=process)
    return process


@pytest.fixture(scope="session")
def review_author(cluster: Cluster, flowforge_crds: list[str]) -> str:
    """Who the reviews posted straight to the server name (`tests.support.admission.SOMEONE`),
    allowed to make them, as the apiserver checks before it sends one (the webhook asks
    first), and nothing more: not to create Jobs."""
    author = str(SOMEONE["username"])
    plurals = sorted({handler.plural for handler in VALIDATING_HANDLERS})
    rules = [{"apiGroups": [GROUP], "resources": plurals, "verbs": ["create", "update", "get"]}]
    grant(cluster, None, role="flowforge-review-author", rules=rules, subject=author)
    return author


@pytest.fixture
def webhook_https(webhook_server: WebhookServer, review_author: str) -> WebhookHttps:
    return WebhookHttps(webhook_server, client=webhook_server.client)


@pytest.fixture
def anonymous_https(webhook_server: WebhookServer) -> WebhookHttps:
    """A client that trusts the server but presents no certificate (any pod)."""
    return WebhookHttps(webhook_server, client=None)


@pytest.fixture
async def webhook_store(webhook_server: WebhookServer) -> AsyncIterator[Pool]:
    """A pool on the webhook server's database, to look at what admission published."""
    pool = await open_pool(webhook_server.dsn, min_size=1, max_size=2, name="webhook-tests")
    try:
        yield pool
    finally:
        await pool.close()
