"""Attempts a move starts, read by name: the one row shape every query that moves a task to
running returns, so that ``Dispatch.of`` (``flowforge.domain.decision``) builds the
instruction to create its Job from each of them alike.

Such a query names the columns :data:`ATTEMPT_COLUMNS` (``attempt_columns`` over a table
alias) and is read with psycopg's ``class_row`` (:func:`read_rows`): into :class:`Attempt`,
or :class:`Step` for the next one of a rollback's compensators or of the ``finally`` tasks,
which run one at a time. The success statement (``outcomes.RECORD_SUCCESS_QUERY``) returns
its dispatched attempts beside its own columns: :meth:`Attempt.of` picks them from its rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from psycopg.rows import class_row

from flowforge.domain.states import TaskRole
from flowforge.store.connection import Connection

ATTEMPT_COLUMNS = ("run_id", "task_key", "role", "attempt", "timeout_seconds", "not_before")

Row = TypeVar("Row")


def seconds_until(moment: str) -> str:
    """SQL for the seconds from now to ``moment`` (a timestamptz expression) on the
    database's clock, the one every due time (``not_before``, a gate's deadline) is set
    by: a wake-up's delay is measured there, never against the operator's wall clock,
    which may be any amount off. ``clock_timestamp()``, not the transaction's start: the
    delay runs from about when the caller gets it."""
    return f"extract(epoch FROM ({moment}) - clock_timestamp())::float8"


def attempt_columns(table: str) -> str:
    """The attempt's columns of the ``flowforge_task`` row ``table`` (an alias)."""
    return ", ".join(f"{table}.{column}" for column in ATTEMPT_COLUMNS)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """A task row's attempt that a move started (``flowforge.domain.decision.AttemptRow``)."""

    run_id: int
    task_key: str
    role: TaskRole
    attempt: int
    timeout_seconds: int | None
    not_before: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", TaskRole(self.role))  # the column is text

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Attempt:
        """The attempt among the columns of a row read by name (``dict_row``)."""
        return cls(**{column: row[column] for column in ATTEMPT_COLUMNS})


@dataclasses.dataclass(frozen=True)
class Step(Attempt):
    """The next of the one-at-a-time tasks (a rollback's compensators, the ``finally``
    tasks): it starts when it is ``due`` (its backoff is over) and none of them is ``busy``
    (running)."""

    task_id: int
    due: bool
    due_in: float  # seconds until it is due (``seconds_until``)
    busy: bool


async def read_rows(
    connection: Connection, row: type[Row], query: str, params: Mapping[str, Any]
) -> list[Row]:
    """The rows of ``query``, each a ``row`` built from its columns by name."""
    cursor = connection.cursor(row_factory=class_row(row))
    await cursor.execute(query, params)
    return await cursor.fetchall()
