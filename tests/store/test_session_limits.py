"""Per-connection limits against a real server: locks and idle transactions end on time."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psycopg
import pytest
from psycopg import errors as pg_errors

from flowforge.store.pool import open_pool
from flowforge.store.session import SessionLimits
from flowforge.store.single import SingleConnection

pytestmark = pytest.mark.store

LIMITS = SessionLimits(
    statement_timeout_seconds=3.0, lock_timeout_seconds=0.5, idle_in_transaction_seconds=1.0
)


async def test_a_statement_blocked_on_a_row_lock_ends_after_the_lock_timeout(
    store_dsn: str,
) -> None:
    pool = await open_pool(store_dsn, min_size=2, max_size=2, limits=LIMITS)
    try:
        async with pool.connection() as setup:
            await setup.execute(
                "INSERT INTO flowforge_lease (name, holder, epoch, expires_at) "
                "VALUES ('locked', 'a', 1, now())"
            )
        async with pool.connection() as holder, holder.transaction():
            await holder.execute("SELECT * FROM flowforge_lease WHERE name = 'locked' FOR UPDATE")
            async with pool.connection() as waiter:
                started = time.monotonic()
                with pytest.raises(pg_errors.LockNotAvailable, match="lock timeout"):
                    await waiter.execute(
                        "UPDATE flowforge_lease SET holder = 'b' WHERE name = 'locked'"
                    )
                waited = time.monotonic() - started
        assert 0.4 <= waited < 5.0, waited  # bounded (unbounded waits for ever); slack for load
    finally:
        await pool.close()


async def test_a_statement_ends_after_the_statement_timeout(store_dsn: str) -> None:
    pool = await open_pool(store_dsn, min_size=1, max_size=1, limits=LIMITS)
    try:
        async with pool.connection() as connection:
            started = time.monotonic()
            with pytest.raises(pg_errors.QueryCanceled, match="statement timeout"):
                await connection.execute("SELECT pg_sleep(30)")
        assert time.monotonic() - started < 5.0
    finally:
        await pool.close()


async def test_an_idle_in_transaction_session_is_cut(store_dsn: str) -> None:
    connection = await psycopg.AsyncConnection.connect(store_dsn, **LIMITS.connection_kwargs())
    try:
        await connection.execute("SELECT * FROM flowforge_lease FOR UPDATE")  # opens a tx
        await asyncio.sleep(2.0)
        with pytest.raises(pg_errors.IdleInTransactionSessionTimeout):
            await connection.execute("SELECT 1")
        assert connection.closed
    finally:
        await connection.close()


async def test_a_pool_use_is_bounded_client_side(store_dsn: str) -> None:
    """Even a server that never answers (paused) cannot hold a pool user past the bound."""
    pool = await open_pool(store_dsn, min_size=1, max_size=1, limits=LIMITS, wait_seconds=0.5)
    try:
        async with pool.connection():
            started = time.monotonic()
            with pytest.raises(Exception, match="couldn't get a connection"):
                async with pool.connection():
                    pass
            assert time.monotonic() - started < 0.5 + 4.5  # not the pool's default 30 s
    finally:
        await pool.close()


async def test_the_single_connection_replaces_a_broken_one(store_dsn: str) -> None:
    single = SingleConnection(store_dsn, limits=LIMITS, name="test-single")
    try:
        first = await single.run(lambda c: c.execute("SELECT pg_backend_pid()"))
        first_pid = (await first.fetchone() or (0,))[0]
        admin = await psycopg.AsyncConnection.connect(store_dsn, autocommit=True)
        await admin.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
        await admin.close()
        with pytest.raises(psycopg.OperationalError):
            await single.run(lambda c: c.execute("SELECT 1"))
        second = await single.run(lambda c: c.execute("SELECT pg_backend_pid()"))
        assert (await second.fetchone() or (0,))[0] not in (0, first_pid)
    finally:
        await single.close()


async def test_a_paused_backend_cannot_hold_a_pool_user_past_the_client_bound(
    store_dsn: str,
) -> None:
    """SIGSTOP on the server process: no statement timeout fires there, the pool's does."""
    limits = SessionLimits(statement_timeout_seconds=1.0, lock_timeout_seconds=0.5)
    pool = await open_pool(store_dsn, min_size=1, max_size=1, limits=limits, wait_seconds=0.5)
    try:
        async with pool.connection() as connection:
            cursor = await connection.execute("SELECT pg_backend_pid()")
            backend = int((await cursor.fetchone() or (0,))[0])
        os.kill(backend, signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                async with pool.connection() as connection:
                    await connection.execute("SELECT 1")
        finally:
            os.kill(backend, signal.SIGCONT)
        took = time.monotonic() - started
        # the bound (statement + margin + wait), then psycopg's cancel attempt (at most 10 s)
        assert limits.client_seconds <= took < limits.client_seconds + 0.5 + 11, took
        async with pool.connection() as connection:  # a fresh connection replaces it
            cursor = await connection.execute("SELECT pg_backend_pid()")
            assert int((await cursor.fetchone() or (0,))[0]) != backend
    finally:
        await pool.close()
