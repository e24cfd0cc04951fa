"""The read API server's database login (issue 24): ``roles.require_read_only_login``
refuses a login that is a superuser, bypasses row-level security, owns the tables or may
write one, naming the login and what it may do; it accepts a plain ``flowforge_server``
login; and ``flowforge server`` refuses to start on a refused one."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from flowforge.server.main import main
from flowforge.store import roles
from flowforge.store.errors import LoginTooPowerfulError

pytestmark = pytest.mark.store


async def refusal(dsn: str) -> str | None:
    """Why the check refuses the DSN's login, or None when it accepts it."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        try:
            await roles.require_read_only_login(connection)
        except LoginTooPowerfulError as refused:
            return str(refused)
    return None


def admin_execute(dsn: str, *statements: sql.Composable) -> None:
    with psycopg.connect(dsn, autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement)


async def test_a_plain_server_login_is_accepted(login_role_dsn: Callable[..., str]) -> None:
    assert await refusal(login_role_dsn("ff_test_server", member_of=roles.SERVER)) is None


async def test_a_superuser_is_refused_by_name(store_dsn: str) -> None:
    with psycopg.connect(store_dsn) as connection:
        row = connection.execute("SELECT current_user").fetchone()
    assert row is not None

    refused = await refusal(store_dsn)

    assert refused is not None
    assert f"database login {row[0]!r} is a superuser" in refused
    assert "a member of flowforge_server and nothing more" in refused


async def test_a_server_login_with_bypassrls_is_refused(
    postgres_server_dsn: str, login_role_dsn: Callable[..., str]
) -> None:
    dsn = login_role_dsn("ff_test_bypass", member_of=roles.SERVER)
    admin_execute(postgres_server_dsn, sql.SQL("ALTER ROLE ff_test_bypass BYPASSRLS"))

    refused = await refusal(dsn)

    assert refused == (
        "database login 'ff_test_bypass' bypasses row-level security (BYPASSRLS, as "
        "ff_test_bypass): refusing to run on it; give this component a login that is a "
        "member of flowforge_server and nothing more"
    )


async def test_a_server_login_that_may_insert_into_one_table_is_refused(
    store_dsn: str, login_role_dsn: Callable[..., str]
) -> None:
    dsn = login_role_dsn("ff_test_writer", member_of=roles.SERVER)
    admin_execute(store_dsn, sql.SQL("GRANT INSERT ON flowforge_run TO ff_test_writer"))

    refused = await refusal(dsn)

    assert refused is not None
    assert "'ff_test_writer' may INSERT, UPDATE, DELETE or TRUNCATE flowforge_run:" in refused


@pytest.mark.parametrize(
    ("group", "power"),
    [
        (roles.MIGRATOR, "owns the store's tables (as flowforge_migrator)"),
        (roles.OPERATOR, "may INSERT, UPDATE, DELETE or TRUNCATE flowforge_definition, "),
    ],
)
async def test_the_owners_and_the_operators_logins_are_refused(
    login_role_dsn: Callable[..., str], group: str, power: str
) -> None:
    login = f"ff_test_{group.removeprefix('flowforge_')}"
    refused = await refusal(login_role_dsn(login, member_of=group))

    assert refused is not None
    assert power in refused


def test_flowforge_server_does_not_start_on_a_superuser(
    store_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    with (
        caplog.at_level(logging.ERROR, logger="flowforge.server"),
        pytest.raises(SystemExit) as exit,
    ):
        main(["--dsn", store_dsn, "--port", str(port)])

    assert exit.value.code == 3  # uvicorn's status for a failed start
    refusals = [r.getMessage() for r in caplog.records if r.name == "flowforge.server"]
    assert len(refusals) == 1 and "refusing to start: database login" in refusals[0]
    assert "is a superuser" in refusals[0]
