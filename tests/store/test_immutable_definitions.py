"""A published definition is immutable in the database itself (migration 14): an attacker
holding the operator's DSN (whose role may UPDATE the engine's tables) tries to rewrite what
a published version runs, or to delete it, and is refused with a clear error; the owner and
a mistaken grant are refused too. The legitimate paths (publishing, the idempotent
re-publish, runs, retention) still work."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from flowforge.store import roles
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.lease import acquire_lease
from flowforge.store.moves import settle_run
from flowforge.store.pool import open_pool
from flowforge.store.retention import prune
from flowforge.store.runs import get_run
from tests.store.conftest import DIAMOND, definition, finish, start_run

pytestmark = pytest.mark.store

LoginDsn = Callable[..., str]

# what an attacker with the operator's role would try: each changes what version 1 runs
REWRITES = [
    "UPDATE flowforge_definition SET document = jsonb_set(document, '{tasks,0,retries}', '5')",
    "UPDATE flowforge_definition SET document = jsonb_set(document, '{tasks,0,retries}', '5'), "
    "fingerprint = 'sha256:' || repeat('0', 64)",
    "UPDATE flowforge_definition SET version = version + 1",
    "UPDATE flowforge_definition SET namespace = 'team-b'",
    "UPDATE flowforge_definition SET workflow = 'other'",
    "UPDATE flowforge_definition SET published_at = now() - interval '1 day'",
]


@pytest.fixture
async def operator(login_role_dsn: LoginDsn) -> AsyncIterator[tuple[str, Pool]]:
    dsn = login_role_dsn("ff_test_operator", member_of=roles.OPERATOR)
    pool = await open_pool(dsn, min_size=1, max_size=2)
    try:
        yield dsn, pool
    finally:
        await pool.close()


A_FINGERPRINT = "sha256:" + "a" * 64


def insert_by_hand(admin: psycopg.Connection[Any]) -> None:
    admin.execute(
        "INSERT INTO flowforge_definition (namespace, workflow, version, fingerprint, "
        "document) VALUES ('team-a', 'etl', 1, %s, '{\"tasks\": [{\"key\": \"a\"}]}')",
        (A_FINGERPRINT,),
    )


def fingerprints(dsn: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(dsn) as connection:
        rows = connection.execute(
            "SELECT namespace, version, fingerprint FROM flowforge_definition ORDER BY id"
        ).fetchall()
    return [(str(n), int(v), str(f)) for n, v, f in rows]


@pytest.mark.parametrize("statement", REWRITES)
async def test_the_operators_role_cannot_rewrite_a_published_definition(
    statement: str, operator: tuple[str, Pool]
) -> None:
    dsn, pool = operator
    published = await publish_definition(pool, namespace="team-a", definition=definition(DIAMOND))
    before = fingerprints(dsn)

    with (
        psycopg.connect(dsn) as connection,
        pytest.raises(
            pg_errors.InsufficientPrivilege,
            match=r"flowforge_definition is immutable: etl v1 in namespace team-a is published "
            r"and may not be changed \(role ff_test_operator\)",
        ) as refused,
    ):
        connection.execute(statement.encode())

    assert refused.value.diag.message_hint == "publish a new version instead"
    assert fingerprints(dsn) == before == [("team-a", 1, published.fingerprint)]
    stored = await load_definition(pool, namespace="team-a", workflow="etl", version=1)
    assert stored.spec.tasks[0].retries == definition(DIAMOND).tasks[0].retries


@pytest.mark.parametrize(
    "statement", ["DELETE FROM flowforge_definition", "TRUNCATE flowforge_definition CASCADE"]
)
def test_the_operators_role_cannot_delete_a_published_definition(
    statement: str, store_dsn: str, login_role_dsn: LoginDsn
) -> None:
    dsn = login_role_dsn("ff_test_operator", member_of=roles.OPERATOR)
    with psycopg.connect(store_dsn, autocommit=True) as admin:
        insert_by_hand(admin)

    with (
        psycopg.connect(dsn) as connection,
        pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied"),
    ):
        connection.execute(statement.encode())

    assert len(fingerprints(dsn)) == 1


@pytest.mark.parametrize(
    ("statement", "operation"),
    [
        (REWRITES[0], "UPDATE"),
        ("DELETE FROM flowforge_definition", "DELETE"),
        ("TRUNCATE flowforge_definition CASCADE", "TRUNCATE"),
    ],
)
def test_the_owner_and_a_mistaken_grant_are_refused_too(
    statement: str, operation: str, store_dsn: str, login_role_dsn: LoginDsn
) -> None:
    migrator = login_role_dsn("ff_test_migrator", member_of=roles.MIGRATOR)
    operator = login_role_dsn("ff_test_operator", member_of=roles.OPERATOR)
    with psycopg.connect(store_dsn, autocommit=True) as admin:
        insert_by_hand(admin)
        # a deployer's mistake: DELETE and TRUNCATE granted straight to a login
        admin.execute("GRANT DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public TO ff_test_operator")

    for dsn, login in ((migrator, "ff_test_migrator"), (operator, "ff_test_operator")):
        expected = (
            rf"etl v1 in namespace team-a is published and may not be changed \(role {login}\)"
            if operation == "UPDATE"
            else rf"flowforge_definition is immutable: {operation} refused for role {login}"
        )
        with (
            psycopg.connect(dsn) as connection,
            pytest.raises(pg_errors.InsufficientPrivilege, match=expected),
        ):
            connection.execute(statement.encode())

    assert fingerprints(store_dsn) == [("team-a", 1, A_FINGERPRINT)]


def test_an_update_that_changes_nothing_passes(store_dsn: str) -> None:
    with psycopg.connect(store_dsn, autocommit=True) as admin:
        insert_by_hand(admin)
        updated = admin.execute("UPDATE flowforge_definition SET version = version").rowcount

    assert updated == 1


async def test_publishing_runs_and_retention_still_work_under_the_roles(
    operator: tuple[str, Pool], login_role_dsn: LoginDsn
) -> None:
    dsn, pool = operator
    lease = await acquire_lease(pool, holder="operator", ttl=timedelta(minutes=5))
    assert lease is not None
    started = await start_run(pool, lease.fence, DIAMOND)
    again = await publish_definition(pool, namespace="team-a", definition=definition(DIAMOND))
    second = await publish_definition(
        pool, namespace="team-a", definition=definition(DIAMOND, version=2)
    )
    for key in ("extract", "clean", "enrich", "load"):
        await finish(pool, lease.fence, started.run, key)
    await settle_run(pool, fence=lease.fence, run_id=started.run.id)
    retention = await open_pool(
        login_role_dsn("ff_test_retention", member_of=roles.RETENTION), min_size=1, max_size=2
    )
    try:
        report = await prune(retention, older_than=timedelta(0))
    finally:
        await retention.close()

    assert (again.created, second.created) == (False, True)
    assert report.runs == 1
    assert (await get_run(pool, started.run.id)).pruned_at is not None
    assert [version for _, version, _ in fingerprints(dsn)] == [1, 2]
    stored: Any = await load_definition(pool, namespace="team-a", workflow="etl", version=1)
    assert stored.fingerprint == again.fingerprint
