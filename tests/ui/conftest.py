"""The whole stack for the browser tests, once per module: the real control plane with the
admission webhooks, a fresh store, the real operator, the real ``flowforge server`` and
Debian's Chromium driven by Playwright, signed in as a ServiceAccount with a real token.

Namespaces: ``home`` (the user may read, cancel and retry runs there), ``other`` (no rights:
its runs must stay invisible) and ``big`` (readable; holds a 10,000-task run made directly in
the store, finished before the operator starts so nothing ever executes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from playwright.async_api import Browser, Page, async_playwright
from psycopg.conninfo import make_conninfo

from flowforge.domain.decision import JobRef
from flowforge.domain.execution import AttemptOutcome, BackoffPolicy, OutcomeReason
from flowforge.domain.validation import parse_definition
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.cancel import cancel_run
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.dispatch import dispatch_due
from flowforge.store.lease import Fence, acquire_lease, release_lease
from flowforge.store.outcomes import record_outcome
from flowforge.store.pool import open_pool
from flowforge.store.roles import SERVER
from flowforge.store.runs import create_run
from tests.plugins.operator import OperatorProcess, fresh_namespace, wait_for_leader
from tests.plugins.postgres import (
    _create_database,
    _drop_database,
    dsn_for_database,
    ensure_login_role,
)
from tests.plugins.webhooks import WebhookServer
from tests.server.conftest import READER_RULES, reader_token

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BIG_LEVELS, BIG_WIDTH = 100, 100  # 10,000 tasks
BIG_RUN = "big-10000"
VIEWER = "ui-viewer"
IMAGES = repo_root() / "docs" / "images"


@dataclass(frozen=True)
class UiStack:
    cluster: Cluster
    api: k8s.ApiClient
    url: str
    token: str
    home: str
    other: str
    big: str
    operator: OperatorProcess
    server_log: Path

    def kubectl_apply(self, path: Path, namespace: str) -> None:
        kubectl(self.cluster, "apply", "-n", namespace, "-f", str(path))

    def logs(self) -> str:
        server = self.server_log.read_text(errors="replace").splitlines()[-30:]
        return "server:\n" + "\n".join(server) + "\noperator:\n" + self.operator.log_tail(30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _bind_viewer(cluster: Cluster, *, namespace: str, home: str) -> None:
    """The same rights in ``namespace`` for the ServiceAccount of ``home``."""
    manifest = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": VIEWER},
                "rules": READER_RULES,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": VIEWER},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": VIEWER,
                },
                "subjects": [{"kind": "ServiceAccount", "name": VIEWER, "namespace": home}],
            },
        ],
    }
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))


def big_definition() -> dict[str, Any]:
    """10,000 tasks in 100 levels of 100; each depends on two tasks of the level above."""
    tasks: list[dict[str, Any]] = []
    for level in range(BIG_LEVELS):
        for i in range(BIG_WIDTH):
            task: dict[str, Any] = {"key": f"t{level}-{i}", "type": "step"}
            if level:
                task["dependsOn"] = sorted(
                    {f"t{level - 1}-{i}", f"t{level - 1}-{(i + 1) % BIG_WIDTH}"}
                )
            tasks.append(task)
    return {
        "workflow": "wide",
        "version": 1,
        "taskTypes": {"step": {"image": "busybox:1.36"}},
        "tasks": tasks,
    }


async def _make_big_run(dsn: str, namespace: str) -> None:
    """Publish, create and finish a 10,000-task run under a lease of the test's own (the
    operator is not running yet): half the roots succeed, then it is cancelled."""
    pool = await open_pool(dsn, min_size=1, max_size=2, name="ui-tests")
    try:
        lease = await acquire_lease(pool, holder="ui-tests", ttl=timedelta(minutes=5))
        assert lease is not None, "the fresh store's lease is held by someone else"
        fence = Fence(lease=lease.name, epoch=lease.epoch)
        await publish_definition(
            pool, namespace=namespace, definition=parse_definition(big_definition())
        )
        stored = await load_definition(pool, namespace=namespace, workflow="wide", version=1)
        created = await create_run(
            pool,
            fence=fence,
            namespace=namespace,
            name=BIG_RUN,
            uid=str(uuid.uuid4()),
            definition=stored,
        )
        run = created.run
        dispatched = await dispatch_due(pool, fence=fence, run_id=run.id)
        success = AttemptOutcome(succeeded=True, reason=OutcomeReason.COMPLETED, exit_code=0)
        for job in dispatched.create_jobs[: BIG_WIDTH // 2]:
            await record_outcome(
                pool,
                fence=fence,
                run_id=run.id,
                run_uid=run.uid,
                job=JobRef(task_key=job.task_key, attempt=job.attempt),
                outcome=success,
                backoff=BackoffPolicy(),
            )
        await cancel_run(pool, fence=fence, run_id=run.id, reason="made by the UI tests")
        await release_lease(pool, lease)
    finally:
        await pool.close()


def _start_server(
    *, dsn: str, kubeconfig: Path, log_path: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowforge.server",
                *("--dsn", dsn, "--kubeconfig", str(kubeconfig)),
                *("--host", "127.0.0.1", "--port", str(port), "--poll-seconds", "0.2"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(repo_root()),
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"flowforge server exited:\n{log_path.read_text()}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/healthz", timeout=2) as response,
        ):
            if response.status == 200:
                return process, url
        time.sleep(0.2)
    process.kill()
    raise AssertionError(f"flowforge server did not serve /healthz:\n{log_path.read_text()}")


@pytest.fixture(scope="module")
def ui_namespaces(
    kube_api: k8s.ApiClient, engine_crds: list[str]
) -> Iterator[tuple[str, str, str]]:
    suffix = uuid.uuid4().hex[:6]
    namespace = contextlib.contextmanager(fresh_namespace)
    with contextlib.ExitStack() as stack:
        home, other, big = (
            stack.enter_context(namespace(kube_api, f"ui-{role}-{suffix}"))
            for role in ("home", "other", "big")
        )
        yield home, other, big


@pytest.fixture(scope="module")
def ui_store(postgres_server_dsn: str, postgres_template: str) -> Iterator[str]:
    name = f"flowforge_ui_{os.getpid()}"
    _create_database(postgres_server_dsn, name, template=postgres_template)
    try:
        yield dsn_for_database(postgres_server_dsn, name)
    finally:
        _drop_database(postgres_server_dsn, name)


@pytest.fixture(scope="module")
async def ui_stack(
    cluster: Cluster,
    kube_api: k8s.ApiClient,
    admission_webhooks: WebhookServer,
    ui_namespaces: tuple[str, str, str],
    ui_store: str,
    postgres_server_dsn: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[UiStack]:
    home, other, big = ui_namespaces
    began = time.monotonic()
    directory = tmp_path_factory.mktemp("ui")
    token = reader_token(cluster, home, account=VIEWER)
    _bind_viewer(cluster, namespace=big, home=home)
    await _make_big_run(ui_store, big)
    made_big = time.monotonic()

    operator = OperatorProcess(
        dsn=ui_store,
        kubeconfig=cluster.kubeconfig,
        namespace=f"{home},{other}",
        log_path=directory / "operator.log",
        identity="ui-operator",
    )
    operator.start()
    login = "ff_test_ui_server"
    ensure_login_role(postgres_server_dsn, login, member_of=SERVER)
    with psycopg.connect(ui_store, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO flowforge_reporting_grant (grantee, namespace) VALUES (%s, '*') "
            "ON CONFLICT DO NOTHING",
            (login,),
        )
    server, url = _start_server(
        dsn=make_conninfo(ui_store, user=login, password=login),
        kubeconfig=cluster.kubeconfig,
        log_path=directory / "server.log",
    )
    try:
        pool = await open_pool(ui_store, min_size=1, max_size=1, name="ui-tests")
        try:
            await wait_for_leader(pool, operator.identity, process=operator)
        finally:
            await pool.close()
        print(
            f"\nUI stack: 10,000-task run made in {made_big - began:.1f} s, "
            f"operator and server up {time.monotonic() - made_big:.1f} s later"
        )
        yield UiStack(
            cluster=cluster,
            api=kube_api,
            url=url,
            token=token,
            home=home,
            other=other,
            big=big,
            operator=operator,
            server_log=directory / "server.log",
        )
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        operator.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium package"
    )
    # Playwright gives every launch a fresh temporary profile (its own --user-data-dir).
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
async def page(browser: Browser, ui_stack: UiStack) -> AsyncIterator[Page]:
    """A new tab, signed in by pasting the ServiceAccount's token."""
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    tab = await context.new_page()
    tab.set_default_timeout(20_000)
    await tab.goto(ui_stack.url)
    await tab.get_by_label("Token").fill(ui_stack.token)
    await tab.get_by_role("button", name="Sign in").click()
    await tab.get_by_test_id("username").wait_for()
    try:
        yield tab
    finally:
        await context.close()
