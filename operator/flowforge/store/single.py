"""One connection of its own, outside the handlers' pool: the lease and the readiness check.

A pool exhausted by handlers must not keep the leader from renewing its lease, so the lease
has this connection to itself, with its own short limits. Every use is bounded client-side;
a use that fails or overruns closes the connection and the next use opens a fresh one (a
connection broken by a restart or a pause is never reused).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from flowforge.store.connection import Connection
from flowforge.store.session import SessionLimits

T = TypeVar("T")
logger = logging.getLogger(__name__)


class SingleConnection:
    def __init__(self, dsn: str, *, limits: SessionLimits, name: str) -> None:
        self._dsn = dsn
        self._limits = limits
        self._name = name
        self._connection: Connection | None = None
        self._lock = asyncio.Lock()

    async def run(self, action: Callable[[Connection], Awaitable[T]]) -> T:
        """``action(connection)`` within the limits' client bound (``TimeoutError`` after)."""
        async with self._lock:
            try:
                async with asyncio.timeout(self._limits.client_seconds):
                    connection = await self._connect()
                    return await action(connection)
            except BaseException:
                await self._discard()
                raise

    async def _connect(self) -> Connection:
        if self._connection is None or self._connection.closed:
            self._connection = await psycopg.AsyncConnection.connect(
                self._dsn,
                autocommit=True,
                application_name=self._name,
                **self._limits.connection_kwargs(),
            )
        return self._connection

    async def _discard(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and not connection.closed:
            connection.pgconn.finish()  # no goodbye: the server may not be answering

    async def close(self) -> None:
        async with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None:
                try:
                    async with asyncio.timeout(1.0):
                        await connection.close()
                except (TimeoutError, psycopg.Error):
                    connection.pgconn.finish()
