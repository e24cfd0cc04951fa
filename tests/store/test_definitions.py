"""Publishing by content, the first-publish race, and re-validation on load."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from flowforge.domain.errors import DefinitionConflictError
from flowforge.store.connection import Pool
from flowforge.store.definitions import (
    PublishedDefinition,
    list_versions,
    load_definition,
    publish_definition,
)
from flowforge.store.errors import DefinitionNotFoundError, StoredDefinitionInvalidError
from flowforge.store.pool import open_pool
from tests.store.conftest import NAMESPACE, definition

pytestmark = pytest.mark.store

TASKS: list[dict[str, Any]] = [{"key": "extract"}, {"key": "load", "dependsOn": ["extract"]}]


async def test_republishing_identical_content_returns_the_existing_row(store: Pool) -> None:
    first = await publish_definition(store, namespace=NAMESPACE, definition=definition(TASKS))
    again = await publish_definition(store, namespace=NAMESPACE, definition=definition(TASKS))

    assert first.created and not again.created
    assert again.id == first.id
    assert again.fingerprint == first.fingerprint


async def test_different_content_under_a_published_version_names_both_fingerprints(
    store: Pool,
) -> None:
    original = definition(TASKS)
    edited = definition(TASKS, description="now with a description")
    await publish_definition(store, namespace=NAMESPACE, definition=original)

    with pytest.raises(DefinitionConflictError) as conflict:
        await publish_definition(store, namespace=NAMESPACE, definition=edited)

    assert conflict.value.existing_fingerprint == original.fingerprint
    assert conflict.value.new_fingerprint == edited.fingerprint
    assert original.fingerprint in str(conflict.value)
    assert edited.fingerprint in str(conflict.value)


async def test_twenty_concurrent_first_publishers_leave_exactly_one_row(store_dsn: str) -> None:
    pool = await open_pool(store_dsn, min_size=20, max_size=20)
    same = definition(TASKS)
    contenders = [same] * 10 + [definition(TASKS, description=f"variant {n}") for n in range(10)]
    try:
        outcomes = await asyncio.gather(
            *(
                publish_definition(pool, namespace=NAMESPACE, definition=candidate)
                for candidate in contenders
            ),
            return_exceptions=True,
        )
    finally:
        await pool.close()

    winners = [o for o in outcomes if isinstance(o, PublishedDefinition) and o.created]
    idempotent = [o for o in outcomes if isinstance(o, PublishedDefinition) and not o.created]
    conflicts = [o for o in outcomes if isinstance(o, DefinitionConflictError)]
    unexpected = [
        o
        for o in outcomes
        if isinstance(o, BaseException)
        and not isinstance(o, DefinitionConflictError | psycopg.errors.UniqueViolation)
    ]
    assert unexpected == []  # in particular no DeadlockDetected
    assert len(winners) == 1
    assert len(winners) + len(idempotent) + len(conflicts) == 20
    winner_fingerprint = winners[0].fingerprint
    assert all(o.fingerprint == winner_fingerprint for o in idempotent)
    assert all(c.existing_fingerprint == winner_fingerprint for c in conflicts)
    async with await psycopg.AsyncConnection.connect(store_dsn) as connection:
        cursor = await connection.execute("SELECT count(*) FROM flowforge_definition")
        assert await cursor.fetchone() == (1,)


async def test_load_returns_what_was_published(store: Pool) -> None:
    spec = definition([*TASKS, {"key": "undo-extract", "compensateFor": "extract"}])
    await publish_definition(store, namespace=NAMESPACE, definition=spec)

    stored = await load_definition(store, namespace=NAMESPACE, workflow="etl", version=1)

    assert stored.spec == spec
    assert stored.fingerprint == spec.fingerprint


async def test_versions_are_listed_and_the_newest_found(store: Pool) -> None:
    for version in (2, 1, 3):
        await publish_definition(
            store, namespace=NAMESPACE, definition=definition(TASKS, version=version)
        )

    assert await list_versions(store, namespace=NAMESPACE, workflow="etl") == [1, 2, 3]
    newest = await load_definition(store, namespace=NAMESPACE, workflow="etl")
    assert newest.spec.version == 3
    with pytest.raises(DefinitionNotFoundError):
        await load_definition(store, namespace="elsewhere", workflow="etl", version=1)


async def _tamper(store: Pool, statement: str) -> None:
    """A superuser's edit by hand, past the immutability trigger (migration 14): loading
    re-validates the row all the same."""
    async with store.connection() as connection, connection.transaction():
        await connection.execute(b"SET LOCAL session_replication_role = replica")
        await connection.execute(statement.encode())


async def test_a_row_changed_by_hand_into_a_cycle_is_refused_on_load(store: Pool) -> None:
    await publish_definition(store, namespace=NAMESPACE, definition=definition(TASKS))
    await _tamper(
        store,
        """UPDATE flowforge_definition SET document = jsonb_set(document, '{tasks,0,dependsOn}',
           '["load"]')""",
    )

    with pytest.raises(StoredDefinitionInvalidError, match="cycle"):
        await load_definition(store, namespace=NAMESPACE, workflow="etl", version=1)


async def test_a_valid_row_whose_content_changed_by_hand_is_refused_on_load(store: Pool) -> None:
    await publish_definition(store, namespace=NAMESPACE, definition=definition(TASKS))
    await _tamper(
        store,
        """UPDATE flowforge_definition SET document = jsonb_set(document, '{tasks,0,retries}',
           '5')""",
    )

    with pytest.raises(StoredDefinitionInvalidError, match="fingerprint"):
        await load_definition(store, namespace=NAMESPACE, workflow="etl", version=1)
