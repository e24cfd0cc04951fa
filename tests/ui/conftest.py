"""The whole stack for the browser tests: the real control plane with the admission
webhooks, PostgreSQL, the real operator and the real ``flowforge server`` (the session's,
from ``tests/plugins/api_server.py``), and Debian's Chromium driven by Playwright, signed in
as the ``reader`` ServiceAccount with its real token.

Namespaces: the tenancy's A (the reader may read, cancel and retry runs there), B (no
rights: its runs must stay invisible) and ``big`` (readable; holds a 10,000-task run made
directly in the store and cancelled at once, so nothing executes it).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from playwright.async_api import Browser, Page, async_playwright

from flowforge.domain.validation import parse_definition
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.definitions import StoredDefinition, load_definition, publish_definition
from flowforge.store.lease import Fence, current_lease
from flowforge.store.runs import create_run
from tests.plugins.api_server import READER_RULES, ApiServer, Tenancy
from tests.plugins.operator import OperatorProcess, fresh_namespace
from tests.plugins.webhooks import WebhookServer

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
READER = "reader"  # the tenancy's ServiceAccount in A
READER_ROLE = "flowforge-ui-tests-reader"  # its rules, to bind in other namespaces
IMAGES = repo_root() / "docs" / "images"


@dataclass(frozen=True)
class UiStack:
    cluster: Cluster
    url: str
    token: str
    home: str
    other: str
    big: str
    operator: OperatorProcess
    server: ApiServer

    def logs(self) -> str:
        return f"server:\n{self.server.log_tail(30)}\noperator:\n{self.operator.log_tail(30)}"


def bind_reader(cluster: Cluster, *, namespaces: Sequence[str], home: str) -> None:
    """The reader's rights of ``home`` in each of ``namespaces`` too (one ``kubectl apply``:
    a ClusterRole of the reader's rules, bound in each namespace)."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": READER_ROLE},
        "rules": READER_RULES,
    }
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": READER, "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": READER_ROLE,
            },
            "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": home}],
        }
        for namespace in namespaces
    ]
    manifest = {"apiVersion": "v1", "kind": "List", "items": [role, *bindings]}
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(manifest))


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


async def operator_fence(pool: Pool) -> Fence:
    """The fence of the running operator's lease: runs made in the store are made under it."""
    lease = await current_lease(pool)
    assert lease is not None, "no operator holds the lease"
    return Fence(lease=lease.name, epoch=lease.epoch)


async def make_cancelled_run(
    pool: Pool,
    *,
    fence: Fence,
    definition: StoredDefinition,
    name: str,
) -> None:
    """A run of ``definition`` made in the store (with its namespace's uid) and cancelled at
    once: it is only to be looked at (its namespace is one no operator watches)."""
    created = await create_run(
        pool,
        fence=fence,
        namespace=definition.namespace,
        name=name,
        uid=str(uuid.uuid4()),
        definition=definition,
        namespace_uid=definition.namespace_uid,
    )
    await cancel_run(pool, fence=fence, run_id=created.run.id, reason="made by the UI tests")


async def _make_big_run(tenancy: Tenancy, namespace: str) -> None:
    """Publish and create a 10,000-task run, cancelled (see ``make_cancelled_run``)."""
    pool = tenancy.pool
    fence = await operator_fence(pool)
    await publish_definition(
        pool, namespace=namespace, definition=parse_definition(big_definition())
    )
    stored = await load_definition(pool, namespace=namespace, workflow="wide", version=1)
    await make_cancelled_run(pool, fence=fence, definition=stored, name=BIG_RUN)


@pytest.fixture(scope="module")
def big_namespace(kube_api: k8s.ApiClient, engine_crds: list[str]) -> Iterator[str]:
    with contextlib.contextmanager(fresh_namespace)(
        kube_api, f"ui-big-{uuid.uuid4().hex[:6]}"
    ) as name:
        yield name


@pytest.fixture(scope="module")
async def ui_stack(
    cluster: Cluster,
    admission_webhooks: WebhookServer,
    tenancy: Tenancy,
    engine: OperatorProcess,
    api_server: ApiServer,
    big_namespace: str,
) -> UiStack:
    began = time.monotonic()
    bind_reader(cluster, namespaces=[big_namespace], home=tenancy.a)
    await _make_big_run(tenancy, big_namespace)
    print(f"\nUI tests: the 10,000-task run made in {time.monotonic() - began:.1f} s")
    return UiStack(
        cluster=cluster,
        url=api_server.url,
        token=tenancy.reader_token,
        home=tenancy.a,
        other=tenancy.b,
        big=big_namespace,
        operator=engine,
        server=api_server,
    )


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


@contextlib.asynccontextmanager
async def signed_in(browser: Browser, *, url: str, token: str) -> AsyncIterator[Page]:
    """A new tab of ``url``, signed in by pasting ``token``."""
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    tab = await context.new_page()
    tab.set_default_timeout(20_000)
    await tab.goto(url)
    await tab.get_by_label("Token").fill(token)
    await tab.get_by_role("button", name="Sign in").click()
    await tab.get_by_test_id("username").wait_for()
    try:
        yield tab
    finally:
        await context.close()


@pytest.fixture
async def page(browser: Browser, ui_stack: UiStack) -> AsyncIterator[Page]:
    """A new tab, signed in by pasting the ServiceAccount's token."""
    async with signed_in(browser, url=ui_stack.url, token=ui_stack.token) as tab:
        yield tab
