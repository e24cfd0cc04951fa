"""A namespace deleted and re-created under the same name is another namespace (migration
15): its new owner, reading through the read API's scoped reader, is never shown the runs,
parameters and definitions written while the name belonged to the old one; rows written
before uids were recorded are shown as before. The recorded uid cannot be rewritten."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from flowforge.store import browse, roles
from flowforge.store.browse import scoped_reader
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.lease import Fence
from flowforge.store.runs import create_run
from tests.store.conftest import DIAMOND, NAMESPACE, definition

pytestmark = pytest.mark.store

OLD_UID = "0b1d0000-0000-0000-0000-000000000001"
NEW_UID = "0e110000-0000-0000-0000-000000000002"


async def run_in(
    store: Pool, fence: Fence, *, workflow: str, name: str, namespace_uid: str | None
) -> int:
    """A run of ``workflow`` v1 (published with the same namespace uid) called ``name``."""
    await publish_definition(
        store,
        namespace=NAMESPACE,
        definition=definition(DIAMOND, workflow=workflow),
        namespace_uid=namespace_uid,
    )
    stored = await load_definition(store, namespace=NAMESPACE, workflow=workflow, version=1)
    created = await create_run(
        store,
        fence=fence,
        namespace=NAMESPACE,
        name=name,
        uid=str(uuid.uuid4()),
        definition=stored,
        parameters={"secret-of": name},
        namespace_uid=namespace_uid,
    )
    return created.run.id


@pytest.fixture
async def history(store: Pool, fence: Fence) -> dict[str, int]:
    """team-a's runs: one from before uids were recorded, one of the namespace's previous
    incarnation (deleted), one of the namespace as it is now."""
    return {
        "legacy": await run_in(store, fence, workflow="legacy", name="legacy", namespace_uid=None),
        "old": await run_in(
            store, fence, workflow="payroll", name="payroll", namespace_uid=OLD_UID
        ),
        "new": await run_in(store, fence, workflow="etl", name="etl", namespace_uid=NEW_UID),
    }


async def what_is_shown(server: Pool, namespace_uids: dict[str, str]) -> dict[str, Any]:
    async with scoped_reader(server, [NAMESPACE], namespace_uids=namespace_uids) as connection:
        runs = await browse.list_runs(connection, namespaces=[NAMESPACE])
        found = {
            name: await browse.find_run(connection, namespace=NAMESPACE, name=name)
            for name in ("legacy", "payroll", "etl")
        }
        versions = await browse.definition_versions(connection, namespace=NAMESPACE)
        known = await browse.namespaces_with_data(connection, [NAMESPACE])
    return {
        "runs": sorted(run.name for run in runs),
        "parameters": sorted(str(run.parameters) for run in runs),
        "found": sorted(name for name, run in found.items() if run is not None),
        "workflows": sorted(row.workflow for row in versions),
        "namespaces": known,
    }


async def test_the_new_namespace_is_never_shown_the_old_ones_runs_or_definitions(
    history: dict[str, int], server_pool: Pool
) -> None:
    now = await what_is_shown(server_pool, {NAMESPACE: NEW_UID})

    assert now == {
        "runs": ["etl", "legacy"],
        "parameters": ["{'secret-of': 'etl'}", "{'secret-of': 'legacy'}"],
        "found": ["etl", "legacy"],
        "workflows": ["etl", "legacy"],
        "namespaces": [NAMESPACE],
    }


async def test_while_the_old_namespace_existed_it_saw_its_own(
    history: dict[str, int], server_pool: Pool
) -> None:
    then = await what_is_shown(server_pool, {NAMESPACE: OLD_UID})

    assert then["runs"] == then["found"] == then["workflows"] == ["legacy", "payroll"]


async def test_a_namespace_that_exists_no_more_shows_only_rows_without_a_uid(
    history: dict[str, int], server_pool: Pool
) -> None:
    gone = await what_is_shown(server_pool, {})

    assert gone["runs"] == gone["found"] == gone["workflows"] == ["legacy"]


async def test_without_the_uids_setting_no_row_with_a_uid_is_shown(
    history: dict[str, int], server_pool: Pool
) -> None:
    """A transaction that did not go through the scoped reader fails closed."""
    async with server_pool.connection() as connection, connection.transaction():
        await roles.scope_namespaces(connection, [NAMESPACE])
        runs = await browse.list_runs(connection, namespaces=[NAMESPACE])

    assert [run.name for run in runs] == ["legacy"]


@pytest.mark.parametrize(
    ("statement", "words"),
    [
        (
            f"UPDATE flowforge_run SET namespace_uid = '{NEW_UID}' WHERE name = 'payroll'",
            "its namespace and namespace uid never change",
        ),
        (
            f"UPDATE flowforge_run SET namespace_uid = '{NEW_UID}' WHERE name = 'legacy'",
            "its namespace and namespace uid never change",
        ),
        (
            f"UPDATE flowforge_definition SET namespace_uid = '{NEW_UID}' "
            "WHERE workflow = 'payroll'",
            "is published and may not be changed",
        ),
    ],
)
async def test_the_operators_role_cannot_move_old_rows_into_the_new_namespace(
    statement: str, words: str, history: dict[str, int], login_role_dsn: Any, server_pool: Pool
) -> None:
    operator = login_role_dsn("ff_test_operator", member_of=roles.OPERATOR)
    with (
        psycopg.connect(operator) as connection,
        pytest.raises(pg_errors.InsufficientPrivilege, match=words),
    ):
        connection.execute(statement.encode())

    assert (await what_is_shown(server_pool, {NAMESPACE: NEW_UID}))["runs"] == ["etl", "legacy"]
