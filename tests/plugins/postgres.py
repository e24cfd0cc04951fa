"""PostgreSQL fixtures: one real server per test session, a fresh database per test.

The server is PostgreSQL 15 from the machine's binaries (``flowforge.localdev.postgres``)
in a temporary directory, with durability off (``fsync``) since test data is throwaway;
``FLOWFORGE_TEST_DSN`` (a role allowed to CREATE DATABASE) replaces it. The schema is
migrated once into a template database; each test gets ``CREATE DATABASE ... TEMPLATE``,
which copies files instead of replaying migrations.

Roles are global to the server, so ``login_role_dsn`` creates its login roles idempotently
(the same name in every test, a member of the group roles of migration 4) and a test's
database decides what they may do.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from flowforge.localdev import postgres as localdev
from flowforge.store.connection import Pool
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool

TEST_SERVER_SETTINGS = {"fsync": "off", "full_page_writes": "off", "synchronous_commit": "off"}
_database_numbers = itertools.count(1)


def _unavailable(reason: str) -> None:
    # A store test that skips proves nothing: a missing server is a failure, also locally.
    pytest.fail(f"PostgreSQL is required by the store tests and is not available: {reason}")


@pytest.fixture(scope="session")
def postgres_server_dsn() -> Iterator[str]:
    """The admin DSN of the session's server (the ``postgres`` database)."""
    override = os.environ.get("FLOWFORGE_TEST_DSN")
    if override:
        yield override
        return
    directory = Path(tempfile.mkdtemp(prefix="flowforge-pg-"))
    try:
        server = localdev.start(directory, settings=TEST_SERVER_SETTINGS)
    except (localdev.PostgresSetupError, OSError) as error:
        shutil.rmtree(directory, ignore_errors=True)
        _unavailable(str(error))
        raise
    try:
        yield server.dsn
    finally:
        localdev.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


def dsn_for_database(dsn: str, database: str) -> str:
    return make_conninfo(dsn, dbname=database)


def _create_database(admin_dsn: str, name: str, *, template: str | None = None) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as connection:
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        connection.execute(statement)


def _drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
async def postgres_template(postgres_server_dsn: str) -> AsyncIterator[str]:
    """Name of a database holding the migrated schema, used as a template."""
    name = f"flowforge_template_{os.getpid()}"
    _drop_database(postgres_server_dsn, name)
    _create_database(postgres_server_dsn, name)
    await migrate(dsn_for_database(postgres_server_dsn, name))
    yield name
    _drop_database(postgres_server_dsn, name)


@pytest.fixture
def empty_database_dsn(postgres_server_dsn: str) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"flowforge_test_{os.getpid()}_{next(_database_numbers)}"
    _create_database(postgres_server_dsn, name)
    yield dsn_for_database(postgres_server_dsn, name)
    _drop_database(postgres_server_dsn, name)


@pytest.fixture
def store_dsn(postgres_server_dsn: str, postgres_template: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = f"flowforge_test_{os.getpid()}_{next(_database_numbers)}"
    _create_database(postgres_server_dsn, name, template=postgres_template)
    yield dsn_for_database(postgres_server_dsn, name)
    _drop_database(postgres_server_dsn, name)


@pytest.fixture
async def store(store_dsn: str) -> AsyncIterator[Pool]:
    """An open pool on a fresh, migrated database."""
    pool = await open_pool(store_dsn, min_size=1, max_size=8)
    try:
        yield pool
    finally:
        await pool.close()


def ensure_login_role(admin_dsn: str, login: str, *, member_of: str) -> None:
    """A login role (password ``login``) that is a member of ``member_of``; idempotent."""
    with psycopg.connect(admin_dsn, autocommit=True) as connection:
        with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            connection.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(login), sql.Literal(login)
                )
            )
        connection.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(member_of), sql.Identifier(login))
        )


@pytest.fixture
def login_role_dsn(postgres_server_dsn: str, store_dsn: str) -> Callable[..., str]:
    """``login_role_dsn(login, member_of=group)``: the test database's DSN as that login."""

    def connect_as(login: str, *, member_of: str) -> str:
        ensure_login_role(postgres_server_dsn, login, member_of=member_of)
        return make_conninfo(store_dsn, user=login, password=login)

    return connect_as
