"""What one request may cost the read API, tried against the real application under uvicorn
on 127.0.0.1 and a real PostgreSQL (as a ``flowforge_server`` login, scoped per request),
with the apiserver's answers (TokenReviews, SubjectAccessReviews, the namespaces) played by
``Apiserver`` below, which counts the reviews it is asked:

- a large definition's detail keeps the caches within their byte budgets, and ``/healthz``
  is answered while the definition is being parsed (it is parsed off the event loop);
- a run listing judges only the namespaces of the rows it shows; ten users listing keep
  each other's answers (least recently used out, never the whole cache);
- namespaces are paged: a user allowed only in the 501st namespace sees it, pages ending
  short once 100 namespaces were denied.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowforge.domain.validation import parse_definition
from flowforge.kube.access_review import CachedAccessReviewer, UserInfo
from flowforge.server import listing, models
from flowforge.server.access import Authenticator, Authorizer
from flowforge.server.graphs import GraphSkeleton
from flowforge.server.state import ServerState, definition_cache, graph_cache
from flowforge.server.views import DefinitionView
from flowforge.store.connection import Pool
from flowforge.store.definitions import definition_text_by_id_on, publish_definition
from flowforge.store.lease import Fence
from tests.store.conftest import DIAMOND, fence, server_pool, start_run  # noqa: F401 (fixtures)
from tests.support.served_api import ask, get, get_json, serving

pytestmark = pytest.mark.store


class Apiserver:
    """Namespaces, bearer tokens ``user-*`` and the grants (user, namespace) of a cluster,
    as the server's own credentials read them; every SubjectAccessReview is recorded."""

    def __init__(self, namespaces: Sequence[str]) -> None:
        self.uids = {name: f"uid-{name}" for name in namespaces}
        self.grants: set[tuple[str, str]] = set()
        self.reviewed: list[tuple[str, str]] = []

    async def review_token(self, token: str) -> UserInfo | None:
        return UserInfo(username=token) if token.startswith("user-") else None

    async def review_access(self, body: Any) -> dict[str, Any]:
        asked = (body["spec"]["user"], body["spec"]["resourceAttributes"]["namespace"])
        self.reviewed.append(asked)
        await asyncio.sleep(0)
        return {"status": {"allowed": asked in self.grants}}

    async def namespace_uids(self, names: Sequence[str] | None = None) -> dict[str, str]:
        return {n: uid for n, uid in self.uids.items() if names is None or n in names}

    def close(self) -> None:
        return None

    def reviews_of(self, user: str) -> list[str]:
        return [namespace for who, namespace in self.reviewed if who == user]


@dataclass
class Api:
    port: int
    probe_port: int
    state: ServerState
    apiserver: Apiserver


@pytest.fixture
def apiserver() -> Apiserver:
    return Apiserver([f"team-{n:02d}" for n in range(30)])


@pytest.fixture
async def api(server_pool: Pool, apiserver: Apiserver) -> AsyncIterator[Api]:  # noqa: F811
    state = ServerState(
        pool=server_pool,
        reviews=apiserver,
        authenticator=Authenticator(apiserver),
        authorizer=Authorizer(CachedAccessReviewer(apiserver.review_access)),
        user_api=None,  # type: ignore[arg-type]  # no call is made as the user here
    )

    async def started() -> ServerState:
        return state

    async with serving(started) as served:
        yield Api(served.port, served.probe_port, state, apiserver)
    state.close()


# --- large definitions -----------------------------------------------------------------


def chains(version: int, *, tasks: int, workflow: str = "big") -> Any:
    """A definition of ``tasks`` tasks in chains of 50."""
    return parse_definition(
        {
            "workflow": workflow,
            "version": version,
            "taskTypes": {"py": {"image": "python:3.12-slim", "command": ["python", "-m"]}},
            "tasks": [
                {"key": f"step-{i:05d}", "type": "py"}
                | ({"dependsOn": [f"step-{i - 1:05d}"]} if i % 50 else {})
                for i in range(tasks)
            ],
        }
    )


async def published_sizes(pool: Pool, *, namespace: str, workflow: str) -> tuple[int, int]:
    """The largest a cache weighs one of the workflow's versions at: (definition, graph)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT id FROM flowforge_definition WHERE namespace = %s AND workflow = %s",
            (namespace, workflow),
        )
        views = [
            DefinitionView.parse(await definition_text_by_id_on(connection, definition_id))
            for (definition_id,) in await cursor.fetchall()
        ]
    return max(view.size for view in views), max(GraphSkeleton(view).size for view in views)


async def test_the_caches_never_hold_more_than_their_byte_budget(api: Api, store: Pool) -> None:
    for version in range(1, 6):
        await publish_definition(store, namespace="team-01", definition=chains(version, tasks=1000))
    await publish_definition(
        store, namespace="team-01", definition=chains(1, tasks=3000, workflow="huge")
    )
    api.apiserver.grants.add(("user-a", "team-01"))
    definition_size, graph_size = await published_sizes(store, namespace="team-01", workflow="big")
    # room for two of the five versions in each cache
    budgets = {"definitions": definition_size * 5 // 2, "graphs": graph_size * 5 // 2}
    api.state.definitions = definition_cache(budgets["definitions"])
    api.state.graphs = graph_cache(budgets["graphs"])

    detail = models.DefinitionDetail.model_validate(
        await get_json(api.port, "/api/v1/namespaces/team-01/definitions/big", token="user-a")
    )

    assert [version.version for version in detail.versions] == [5, 4, 3, 2, 1]
    assert all(len(version.graph.nodes) == 1000 for version in detail.versions)
    assert detail.versions[0].graph.levels == 50
    assert detail.versions[0].task_types["py"].command == ["python", "-m"]
    for name, budget in budgets.items():
        cache = getattr(api.state, name)
        assert (len(cache), cache.held <= budget) == (2, True), name
    held = {name: getattr(api.state, name).held for name in budgets}
    # a version that weighs more than a whole budget is shown, and kept by neither cache
    shown = await get_json(api.port, "/api/v1/namespaces/team-01/definitions/huge", token="user-a")
    assert len(shown["versions"][0]["graph"]["nodes"]) == 3000
    assert {name: getattr(api.state, name).held for name in budgets} == held


async def test_healthz_is_answered_while_a_large_definition_is_parsed(
    api: Api, store: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    await publish_definition(store, namespace="team-01", definition=chains(1, tasks=1000))
    api.apiserver.grants.add(("user-a", "team-01"))
    parsing, answered = threading.Event(), threading.Event()
    parse = DefinitionView.parse

    def held_parse(text: Any) -> DefinitionView:
        # the parse waits (at most 10 s) for /healthz to be answered: on the event loop, it
        # would hold the loop, and /healthz could be answered only after the definition
        parsing.set()
        answered.wait(timeout=10)
        return parse(text)

    monkeypatch.setattr(DefinitionView, "parse", staticmethod(held_parse))
    finished: list[str] = []

    async def definitions() -> None:
        await get_json(api.port, "/api/v1/namespaces/team-01/definitions/big", token="user-a")
        finished.append("definitions")

    request = asyncio.ensure_future(definitions())
    assert await asyncio.to_thread(parsing.wait, 10), "the definition was never parsed"
    assert await ask(api.port, get("/healthz")) == (200, b"ok")
    finished.append("healthz")
    answered.set()
    await asyncio.wait_for(request, timeout=30)

    assert finished == ["healthz", "definitions"]


# --- listing runs: lazy reviews, an LRU of answers -------------------------------------


@pytest.fixture
async def runs_everywhere(store: Pool, fence: Fence, apiserver: Apiserver) -> list[str]:  # noqa: F811
    """One run in each namespace, created in namespace order (team-29's is the newest)."""
    for namespace in apiserver.uids:
        await start_run(store, fence, DIAMOND, namespace=namespace)
    return sorted(apiserver.uids, reverse=True)


async def test_a_run_listing_judges_only_the_namespaces_of_the_rows_it_shows(
    api: Api, runs_everywhere: list[str]
) -> None:
    apiserver = api.apiserver
    apiserver.grants |= {("user-a", namespace) for namespace in runs_everywhere}
    apiserver.grants.add(("user-b", "team-02"))

    page = await get_json(api.port, "/api/v1/runs?limit=5", token="user-a")

    assert [run["namespace"] for run in page["items"]] == runs_everywhere[:5]
    # those shown, and the next one's (is there more?): not the cluster's 30
    assert sorted(apiserver.reviews_of("user-a")) == sorted(runs_everywhere[:6])
    following = await get_json(
        api.port, f"/api/v1/runs?limit=5&continue={page['continue']}", token="user-a"
    )
    assert [run["namespace"] for run in following["items"]] == runs_everywhere[5:10]
    assert sorted(apiserver.reviews_of("user-a")) == sorted(runs_everywhere[:11])
    # a user allowed in one namespace gets its run, and nothing else of the others
    only = await get_json(api.port, "/api/v1/runs", token="user-b")
    assert [(run["namespace"], run["name"]) for run in only["items"]] == [("team-02", "etl-run")]
    assert only["continue"] is None


async def test_ten_users_listing_keep_each_others_answers(
    server_pool: Pool,  # noqa: F811
    apiserver: Apiserver,
    runs_everywhere: list[str],
) -> None:
    users = [f"user-{n}" for n in range(10)]
    apiserver.grants |= {(user, namespace) for user in users for namespace in runs_everywhere}
    # room for fewer answers than the ten listings get (6 each): the oldest must go; no
    # answer expires meanwhile (the clock stands still)
    reviewer = CachedAccessReviewer(apiserver.review_access, max_entries=50, clock=lambda: 0.0)
    state = ServerState(
        pool=server_pool,
        reviews=apiserver,
        authenticator=Authenticator(apiserver),
        authorizer=Authorizer(reviewer),
        user_api=None,  # type: ignore[arg-type]
    )

    async def started() -> ServerState:
        return state

    async with serving(started) as served:
        for user in users:
            await get_json(served.port, "/api/v1/runs?limit=5", token=user)
        first_round = len(apiserver.reviewed)
        # the nine listed last list again, newest first: every answer is still there
        for user in reversed(users[2:]):
            await get_json(served.port, "/api/v1/runs?limit=5", token=user)
    state.close()

    assert first_round == 60
    assert len(apiserver.reviewed) == first_round


async def test_a_page_of_runs_ends_short_once_its_share_of_namespaces_were_denied(
    api: Api, runs_everywhere: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10 instead of 100 denials a page: 30 namespaces show it
    monkeypatch.setattr(listing, "MAX_DENIED_PER_PAGE", 10)
    api.apiserver.grants.add(("user-c", "team-03"))

    pages = [await get_json(api.port, "/api/v1/runs?limit=5", token="user-c")]
    while pages[-1]["continue"] is not None:
        cursor = pages[-1]["continue"]
        pages.append(await get_json(api.port, f"/api/v1/runs?continue={cursor}", token="user-c"))

    assert [[run["namespace"] for run in page["items"]] for page in pages] == [[], [], ["team-03"]]
    assert sorted(api.apiserver.reviews_of("user-c")) == sorted(runs_everywhere)


# --- namespaces: paged -------------------------------------------------------------------


@pytest.fixture
def six_hundred_namespaces(store_dsn: str) -> list[str]:
    """600 namespaces, ``ns-0001`` to ``ns-0600``, each holding a definition (one INSERT)."""
    names = [f"ns-{n:04d}" for n in range(1, 601)]
    spec = chains(1, tasks=3, workflow="small")
    with psycopg.connect(store_dsn, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO flowforge_definition (namespace, workflow, version, fingerprint, "
            "document) SELECT name, %s, 1, %s, %s FROM unnest(%s::text[]) AS name",
            (spec.workflow, spec.fingerprint, Jsonb(spec.to_document()), names),
        )
    return names


async def test_a_user_allowed_only_in_the_501st_namespace_sees_it(
    api: Api, six_hundred_namespaces: list[str]
) -> None:
    apiserver = api.apiserver
    apiserver.uids = {name: f"uid-{name}" for name in six_hundred_namespaces}
    apiserver.grants.add(("user-d", "ns-0501"))
    apiserver.grants |= {("user-e", name) for name in apiserver.uids}

    pages = [await get_json(api.port, "/api/v1/namespaces", token="user-d")]
    reviews = [len(apiserver.reviewed)]
    while pages[-1]["continue"] is not None:
        cursor = pages[-1]["continue"]
        pages.append(
            await get_json(api.port, f"/api/v1/namespaces?continue={cursor}", token="user-d")
        )
        reviews.append(len(apiserver.reviewed) - sum(reviews))

    assert [item["name"] for page in pages for item in page["items"]] == ["ns-0501"]
    # each page judged 100 namespaces the user may not read, then stopped (the last one:
    # ns-0501 and the 99 after it)
    assert reviews == [listing.MAX_DENIED_PER_PAGE] * 6
    assert sorted(set(apiserver.reviews_of("user-d"))) == sorted(apiserver.uids)
    # a user allowed in all 600 gets them in pages of the limit
    first = await get_json(api.port, "/api/v1/namespaces?limit=500", token="user-e")
    rest = await get_json(
        api.port, f"/api/v1/namespaces?continue={first['continue']}", token="user-e"
    )
    shown = [item["name"] for page in (first, rest) for item in page["items"]]
    assert (len(first["items"]), shown, rest["continue"]) == (500, sorted(apiserver.uids), None)
