"""Migrations: applied once under a lock, a second run is a no-op, newer schemas refused."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from flowforge.store.errors import SchemaNotMigratedError, SchemaTooNewError
from flowforge.store.migrate import migrate, newest_known_version
from flowforge.store.pool import open_pool

pytestmark = pytest.mark.store


async def test_applying_migrations_twice_is_a_no_op(empty_database_dsn: str) -> None:
    first = await migrate(empty_database_dsn)
    second = await migrate(empty_database_dsn)

    assert first.applied == tuple(range(1, newest_known_version() + 1))
    assert second.applied == ()
    assert second.schema_version == newest_known_version()


async def test_concurrent_migrators_apply_each_file_once(empty_database_dsn: str) -> None:
    reports = await asyncio.gather(*(migrate(empty_database_dsn) for _ in range(4)))

    assert sorted(len(report.applied) for report in reports) == [0, 0, 0, newest_known_version()]
    with psycopg.connect(empty_database_dsn) as connection:
        rows = connection.execute("SELECT version FROM flowforge_schema_migration").fetchall()
    assert [version for (version,) in rows] == list(range(1, newest_known_version() + 1))


async def test_a_schema_newer_than_known_is_refused_with_a_message(
    empty_database_dsn: str,
) -> None:
    await migrate(empty_database_dsn)
    future = newest_known_version() + 1
    with psycopg.connect(empty_database_dsn) as connection:
        connection.execute(
            "INSERT INTO flowforge_schema_migration (version, name, sha256) "
            "VALUES (%s, 'from_the_future', 'x')",
            (future,),
        )

    with pytest.raises(SchemaTooNewError, match=rf"version {future}, newer than") as refused:
        await migrate(empty_database_dsn)
    assert "upgrade FlowForge" in str(refused.value)
    with pytest.raises(SchemaTooNewError):
        await open_pool(empty_database_dsn)


async def test_the_pool_refuses_an_unmigrated_database(empty_database_dsn: str) -> None:
    with pytest.raises(SchemaNotMigratedError, match="flowforge db migrate"):
        await open_pool(empty_database_dsn)
