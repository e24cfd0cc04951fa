"""Versioned SQL migrations, applied in order under a PostgreSQL advisory lock.

Migration files are ``migrations/NNNN_name.sql``; the number is the schema version. The
applied versions (with each file's SHA-256) are recorded in ``flowforge_schema_migration``.
Concurrent callers (``flowforge db migrate`` and operator replicas starting together) are
serialised by a transaction-level advisory lock, so each file is applied exactly once and a
second run is a no-op. A database whose schema is newer than the newest file here is refused.

Versions are unique and increasing but may have gaps (two branches may each add one); every
known version missing from the ledger is applied, in order, so files on parallel branches
must not depend on each other. Once the roles migration (``roles.ROLES_MIGRATION``) is in,
migrations run as ``flowforge_migrator`` (``SET LOCAL ROLE``, when the login is a member),
so what they create is owned by that group and any migrator login can migrate later.
``lock_timeout`` bounds how long a DDL statement waits for a table lock (a pre-upgrade hook
must fail fast rather than queue every operator query behind its ALTER TABLE).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from datetime import timedelta
from importlib import resources

import psycopg

from flowforge.store.connection import Connection
from flowforge.store.errors import SchemaNotMigratedError, SchemaTooNewError, StoreError
from flowforge.store.roles import MIGRATOR, ROLES_MIGRATION, is_member, set_local_role

# an arbitrary constant naming "the FlowForge schema" among advisory locks
MIGRATION_LOCK_KEY = 0x466C6F77466F7267
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS flowforge_schema_migration (
    version    integer PRIMARY KEY CHECK (version >= 1),
    name       text NOT NULL,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class MigrationReport:
    applied: tuple[int, ...]
    schema_version: int


def known_migrations() -> tuple[Migration, ...]:
    directory = resources.files("flowforge.store").joinpath("migrations")
    found: list[Migration] = []
    for entry in directory.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match is None:
            continue
        found.append(Migration(version=int(match[1]), name=match[2], sql=entry.read_text("utf-8")))
    found.sort(key=lambda migration: migration.version)
    versions = [migration.version for migration in found]
    if not versions or versions[0] != 1 or len(set(versions)) != len(versions):
        raise StoreError(f"migration files must start at 1, each number once: {versions}")
    return tuple(found)


def newest_known_version() -> int:
    return known_migrations()[-1].version


async def _applied_versions(connection: Connection) -> dict[int, str]:
    exists = await connection.execute(
        "SELECT to_regclass('flowforge_schema_migration') IS NOT NULL"
    )
    row = await exists.fetchone()
    if row is None or not row[0]:
        return {}
    cursor = await connection.execute("SELECT version, sha256 FROM flowforge_schema_migration")
    return {int(version): str(digest) for version, digest in await cursor.fetchall()}


async def _act_as_migrator(connection: Connection, applied: set[int]) -> bool:
    if ROLES_MIGRATION not in applied or not await is_member(connection, MIGRATOR):
        return False
    await set_local_role(connection, MIGRATOR)
    return True


async def migrate_connection(
    connection: Connection, *, lock_timeout: timedelta | None = None
) -> MigrationReport:
    """Apply every missing migration in one transaction on ``connection``."""
    migrations = known_migrations()
    newest = migrations[-1].version
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        if lock_timeout is not None:
            milliseconds = max(1, int(lock_timeout.total_seconds() * 1000))
            await connection.execute(
                "SELECT set_config('lock_timeout', %s, true)", (f"{milliseconds}ms",)
            )
        await connection.execute(_CREATE_LEDGER)
        applied = await _applied_versions(connection)
        database_version = max(applied, default=0)
        if database_version > newest:
            raise SchemaTooNewError(database_version=database_version, known_version=newest)
        for migration in migrations:
            digest = applied.get(migration.version)
            if digest is not None and digest != migration.sha256:
                raise StoreError(
                    f"migration {migration.version} ({migration.name}) was changed after it "
                    "was applied; migrations are immutable, add a new one instead"
                )
        missing = [m for m in migrations if m.version not in applied]
        done = set(applied)
        as_migrator = await _act_as_migrator(connection, done)
        for migration in missing:
            if not as_migrator:
                as_migrator = await _act_as_migrator(connection, done)
            await connection.execute(migration.sql.encode())
            done.add(migration.version)
            await connection.execute(
                "INSERT INTO flowforge_schema_migration (version, name, sha256) "
                "VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.sha256),
            )
    return MigrationReport(
        applied=tuple(m.version for m in missing), schema_version=max(newest, database_version)
    )


async def migrate(dsn: str, *, lock_timeout: timedelta | None = None) -> MigrationReport:
    async with await psycopg.AsyncConnection.connect(dsn) as connection:
        return await migrate_connection(connection, lock_timeout=lock_timeout)


async def schema_version(connection: Connection) -> int:
    return max(await _applied_versions(connection), default=0)


async def check_schema(connection: Connection) -> int:
    """Refuse a schema newer than known (or missing a known migration); return its version."""
    applied = await _applied_versions(connection)
    await connection.rollback()
    version = max(applied, default=0)
    newest = newest_known_version()
    if version > newest:
        raise SchemaTooNewError(database_version=version, known_version=newest)
    if any(migration.version not in applied for migration in known_migrations()):
        raise SchemaNotMigratedError(database_version=version, known_version=newest)
    return version
