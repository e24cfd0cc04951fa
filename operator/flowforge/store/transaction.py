"""Run a decision in a transaction, again after a serialization failure or a deadlock.

Every store write that decides something goes through ``in_transaction``: PostgreSQL may
abort one of two conflicting transactions, and the right answer is to run the whole
transaction again from the start (it re-reads, so it decides on fresh data).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from psycopg import errors as pg_errors

from flowforge.store.connection import Connection, Pool

T = TypeVar("T")

RETRYABLE_ERRORS: tuple[type[Exception], ...] = (
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
)
DEFAULT_ATTEMPTS = 6
BASE_DELAY_SECONDS = 0.005
MAX_DELAY_SECONDS = 0.5


def backoff_delay(retry_number: int) -> float:
    """Full jitter: a random delay up to an exponentially growing, capped bound."""
    bound = min(MAX_DELAY_SECONDS, BASE_DELAY_SECONDS * 2**retry_number)
    return random.uniform(0, bound)


async def in_transaction(
    pool: Pool,
    decision: Callable[[Connection], Awaitable[T]],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    single_statement: bool = False,
) -> T:
    """Run ``decision(connection)`` inside a transaction; retry it on retryable errors.

    With ``single_statement`` the decision makes one statement, which the autocommit
    connection runs as its own transaction (no BEGIN/COMMIT round trips).
    """
    for retry_number in range(attempts):
        try:
            async with pool.connection() as connection:
                if single_statement:
                    return await decision(connection)
                async with connection.transaction():
                    return await decision(connection)
        except RETRYABLE_ERRORS:
            if retry_number == attempts - 1:
                raise
            await asyncio.sleep(backoff_delay(retry_number))
    raise AssertionError("unreachable: the last attempt either returns or raises")
