"""The UI follows the read API's paging, in Chromium against the session's real server (see
conftest), signed in as the reader. Seeded: 101 namespaces the reader may read (one more
than the namespace filter's page of 100), each holding a definition, and 101 it may not
(one more than the 100 denials that end a page of the API), each holding a run newer than
the readable run of the last readable namespace. The filter reads the first page (following
the short page the denied namespaces make), and the last readable namespace only when asked
for more or when its name is typed; the run list follows the short pages to that run.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client as k8s
from playwright.async_api import Browser, Page

from flowforge.domain.validation import parse_definition
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.definitions import StoredDefinition, load_definition, publish_definition
from tests.plugins.api_server import ApiServer, Tenancy
from tests.plugins.operator import OperatorProcess
from tests.ui.conftest import bind_reader, make_cancelled_run, operator_fence, signed_in

pytestmark = pytest.mark.cluster

PAGE = 100  # the namespace filter's page (ui/src/components/NamespaceFilter.tsx)
DENIED_PER_PAGE = 100  # server/listing.py::MAX_DENIED_PER_PAGE
RUN = "seen"
LABEL = "flowforge.io/ui-paging"  # the seeded namespaces', deleted by it
TICK = {
    "workflow": "tick",
    "version": 1,
    "taskTypes": {"step": {"image": "busybox:1.36"}},
    "tasks": [{"key": "only", "type": "step"}],
}


@dataclass(frozen=True)
class Seeded:
    readable: list[str]  # by name; the last one holds RUN
    url: str
    token: str

    @property
    def last(self) -> str:
        return self.readable[-1]


def _namespace_uids(api: k8s.ApiClient, label: str) -> dict[str, str]:
    listed = k8s.CoreV1Api(api).list_namespace(label_selector=label)
    return {ns.metadata.name: ns.metadata.uid for ns in listed.items}


@pytest.fixture(scope="module")
async def seeded(
    cluster: Cluster, tenancy: Tenancy, engine: OperatorProcess, api_server: ApiServer
) -> AsyncIterator[Seeded]:
    began = time.monotonic()
    prefix = f"ui-pg-{uuid.uuid4().hex[:6]}"
    # the denied ones sort first: the filter's first page of the API ends short on them
    denied = [f"{prefix}-d{n:03d}" for n in range(DENIED_PER_PAGE + 1)]
    readable = [f"{prefix}-r{n:03d}" for n in range(PAGE + 1)]
    label = f"{LABEL}={prefix}"
    namespaces = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": n, "labels": {LABEL: prefix}},
            }
            for n in denied + readable
        ],
    }
    kubectl(cluster, "create", "-f", "-", stdin=json.dumps(namespaces))
    try:
        bind_reader(cluster, namespaces=readable, home=tenancy.a)
        uids = _namespace_uids(tenancy.api, label)
        pool, spec = tenancy.pool, parse_definition(TICK)

        async def published(namespace: str) -> StoredDefinition:
            await publish_definition(
                pool, namespace=namespace, definition=spec, namespace_uid=uids[namespace]
            )
            return await load_definition(pool, namespace=namespace, workflow="tick", version=1)

        stored = dict(zip(uids, await asyncio.gather(*map(published, uids)), strict=True))
        fence = await operator_fence(pool)
        # the readable run first: every denied namespace's run is newer
        await make_cancelled_run(pool, fence=fence, definition=stored[readable[-1]], name=RUN)
        await asyncio.gather(
            *(make_cancelled_run(pool, fence=fence, definition=stored[n], name=RUN) for n in denied)
        )
        print(f"\nUI paging: {len(uids)} namespaces seeded in {time.monotonic() - began:.1f} s")
        yield Seeded(readable, api_server.url, tenancy.reader_token)
    finally:
        # not waited for (minutes on a busy machine): until they are gone the API still
        # lists them, and the denied ones' runs make the reader's first page short. This
        # module runs after test_ui.py: once these 102 one-task runs are in, PostgreSQL's
        # statistics make its 10,000-task run's dependency INSERT take minutes
        kubectl(cluster, "delete", "namespaces", "-l", label, "--wait=false")


@pytest.fixture
async def tab(browser: Browser, seeded: Seeded) -> AsyncIterator[Page]:
    async with signed_in(browser, url=seeded.url, token=seeded.token) as page:
        yield page


async def _asked(page: Page, path: str) -> list[dict[str, list[str]]]:
    """The queries of this document's requests for ``path``, in the order they were made."""
    urls: list[str] = await page.evaluate(
        "performance.getEntriesByType('resource').map((entry) => entry.name)"
    )
    return [parse_qs(urlsplit(url).query) for url in urls if urlsplit(url).path == path]


def _option(namespace: str) -> str:
    return f'select[name=namespace] option[value="{namespace}"]'


async def test_a_namespace_past_the_first_page_is_read_on_more_and_selectable(
    tab: Page, seeded: Seeded
) -> None:
    await tab.goto(f"{seeded.url}/runs")
    read = tab.get_by_test_id("namespaces-read")
    await read.filter(has_text="so far").wait_for()

    # the API's first page ended short on the denied namespaces: the filter read on
    assert await tab.locator(_option(seeded.readable[0])).count() == 1
    assert await tab.locator(_option(seeded.last)).count() == 0
    pages = await _asked(tab, "/api/v1/namespaces")
    assert len(pages) >= 2 and "continue" in pages[1], pages
    assert all(int(page["limit"][0]) <= PAGE for page in pages), pages

    await tab.get_by_role("button", name="More namespaces").click()
    await tab.locator(_option(seeded.last)).wait_for(state="attached")
    await tab.locator("select[name=namespace]").select_option(seeded.last)
    await tab.wait_for_url(f"**/runs?namespace={seeded.last}")
    await tab.locator(f'tr[data-run="{seeded.last}/{RUN}"]').wait_for()


async def test_a_namespace_past_the_first_page_is_read_when_its_name_is_typed(
    tab: Page, seeded: Seeded
) -> None:
    await tab.goto(f"{seeded.url}/definitions")
    await tab.get_by_test_id("namespaces-read").filter(has_text="so far").wait_for()
    assert await tab.locator(_option(seeded.last)).count() == 0

    await tab.get_by_label("Find namespace").fill(seeded.last)
    await tab.locator(_option(seeded.last)).wait_for(state="attached")
    # the options are those starting with the name typed, and the one chosen (the first)
    options = await tab.locator("select[name=namespace] option").evaluate_all(
        "(options) => options.map((o) => o.value)"
    )
    assert options.count(seeded.last) == 1 and len(options) <= 2, options
    await tab.locator("select[name=namespace]").select_option(seeded.last)
    await tab.get_by_test_id("definitions").get_by_role("link", name="tick").wait_for()


async def test_the_run_list_follows_short_pages_to_the_runs_behind_denied_namespaces(
    tab: Page, seeded: Seeded, api_server: ApiServer
) -> None:
    first = api_server.request("/api/v1/runs?limit=50", token=seeded.token).json()
    shown = [f"{run['namespace']}/{run['name']}" for run in first["items"]]
    # the API's own first page stops short of the run, after the denied namespaces
    assert f"{seeded.last}/{RUN}" not in shown and first["continue"], first

    await tab.goto(f"{seeded.url}/runs")
    await tab.locator(f'tr[data-run="{seeded.last}/{RUN}"]').wait_for()
    runs = await _asked(tab, "/api/v1/runs")
    assert "continue" not in runs[0] and "continue" in runs[1], runs
    assert await tab.get_by_test_id("runs-short").count() == 0
