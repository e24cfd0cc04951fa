"""Migrations: applied once under a lock, a second run is a no-op, newer schemas refused."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from flowforge.domain.states import RunPhase
from flowforge.store import migrate as migrate_module
from flowforge.store.errors import SchemaNotMigratedError, SchemaTooNewError
from flowforge.store.migrate import known_migrations, migrate, newest_known_version
from flowforge.store.pool import open_pool
from flowforge.store.sweep import SWEEP_QUERY

pytestmark = pytest.mark.store


def known_versions() -> tuple[int, ...]:
    return tuple(migration.version for migration in known_migrations())


async def test_applying_migrations_twice_is_a_no_op(empty_database_dsn: str) -> None:
    first = await migrate(empty_database_dsn)
    second = await migrate(empty_database_dsn)

    assert first.applied == known_versions()
    assert second.applied == ()
    assert second.schema_version == newest_known_version()


async def test_concurrent_migrators_apply_each_file_once(empty_database_dsn: str) -> None:
    reports = await asyncio.gather(*(migrate(empty_database_dsn) for _ in range(4)))

    assert sorted(len(report.applied) for report in reports) == [0, 0, 0, len(known_versions())]
    with psycopg.connect(empty_database_dsn) as connection:
        rows = connection.execute("SELECT version FROM flowforge_schema_migration").fetchall()
    assert tuple(sorted(version for (version,) in rows)) == known_versions()


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


async def test_schema_2_spells_the_phases_of_existing_runs_as_kubernetes_does(
    empty_database_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = known_migrations()[:1]
    monkeypatch.setattr(migrate_module, "known_migrations", lambda: first)
    assert (await migrate(empty_database_dsn)).applied == (1,)
    monkeypatch.undo()
    # schema 1's spelling of each phase, and whether a run in it is finished
    old_spelling = {
        "pending": False,
        "running": False,
        "succeeded": True,
        "failed": True,
        "cancelled": True,
    }
    with psycopg.connect(empty_database_dsn) as connection:
        definition = connection.execute(
            "INSERT INTO flowforge_definition (namespace, workflow, version, fingerprint, "
            "document) VALUES ('ns', 'wf', 1, %s, '{}') RETURNING id",
            ("sha256:" + "0" * 64,),
        ).fetchone()
        assert definition is not None
        for phase, finished in old_spelling.items():
            connection.execute(
                "INSERT INTO flowforge_run (namespace, name, uid, definition_id, phase, "
                "finished_at) VALUES ('ns', %s, %s, %s, %s, CASE WHEN %s THEN now() END)",
                (phase, phase, definition[0], phase, finished),
            )

    report = await migrate(empty_database_dsn)

    assert report.applied == known_versions()[1:]
    with psycopg.connect(empty_database_dsn) as connection:
        rows = connection.execute("SELECT name, phase FROM flowforge_run").fetchall()
        connection.execute("SET enable_seqscan = off")
        plan = connection.execute(
            ("EXPLAIN (FORMAT JSON) " + SWEEP_QUERY).encode(), {"after": 0, "limit": 10}
        ).fetchone()
    assert dict(rows) == {phase: RunPhase(phase.capitalize()) for phase in old_spelling}
    assert plan is not None and "flowforge_run_active_idx" in json.dumps(plan[0])
