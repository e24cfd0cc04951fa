"""The database itself refuses illegal states: CHECK constraints and a unique index."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from flowforge.domain.states import (
    TERMINAL_RUN_PHASES,
    CompensationState,
    RunPhase,
    TaskRole,
    TaskState,
)
from flowforge.store.connection import Pool
from flowforge.store.lease import Fence
from tests.store.conftest import start_run

pytestmark = pytest.mark.store

TASKS: list[dict[str, Any]] = [
    {"key": "a"},
    {"key": "b", "dependsOn": ["a"]},
    {"key": "undo-a", "compensateFor": "a"},
    {"key": "undo-b", "compensateFor": "b"},
]


async def _refused(dsn: str, statement: str) -> psycopg.errors.IntegrityError:
    async with await psycopg.AsyncConnection.connect(dsn) as connection:
        with pytest.raises(psycopg.errors.IntegrityError) as refused:
            await connection.execute(statement.encode())
    return refused.value


async def test_an_unknown_task_state_is_refused_by_a_check(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    await start_run(store, fence, TASKS)

    error = await _refused(
        store_dsn, "UPDATE flowforge_task SET state = 'done' WHERE task_key = 'a'"
    )

    assert isinstance(error, psycopg.errors.CheckViolation)
    assert error.diag.constraint_name == "flowforge_task_state_matches_role"


async def test_a_compensation_state_on_a_forward_task_is_refused(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    await start_run(store, fence, TASKS)

    error = await _refused(
        store_dsn,
        f"UPDATE flowforge_task SET state = '{CompensationState.NOT_TRIGGERED}' "
        "WHERE task_key = 'a'",
    )

    assert isinstance(error, psycopg.errors.CheckViolation)


async def test_a_waiting_task_cannot_be_made_ready_with_dependencies_pending(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    await start_run(store, fence, TASKS)

    error = await _refused(
        store_dsn, f"UPDATE flowforge_task SET state = '{TaskState.READY}' WHERE task_key = 'b'"
    )

    assert error.diag.constraint_name == (
        "flowforge_task_released_only_without_pending_dependencies"
    )


async def test_a_finished_phase_without_a_finish_time_is_refused(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    await start_run(store, fence, TASKS)

    error = await _refused(store_dsn, f"UPDATE flowforge_run SET phase = '{RunPhase.SUCCEEDED}'")

    assert error.diag.constraint_name == "flowforge_run_finished_iff_terminal"
    bogus = await _refused(store_dsn, "UPDATE flowforge_run SET phase = 'Paused'")
    assert bogus.diag.constraint_name == "flowforge_run_phase_check"


async def test_the_lowercase_phases_of_schema_1_are_refused(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    await start_run(store, fence, TASKS)

    for phase in RunPhase:
        error = await _refused(
            store_dsn, f"UPDATE flowforge_run SET phase = '{phase.value.lower()}'"
        )
        assert error.diag.constraint_name == "flowforge_run_phase_check", phase


async def test_a_finished_run_cannot_be_compensating(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    await start_run(store, fence, TASKS)

    error = await _refused(
        store_dsn,
        f"UPDATE flowforge_run SET compensating = true, phase = '{RunPhase.FAILED}', "
        "finished_at = now()",
    )

    assert error.diag.constraint_name == "flowforge_run_compensating_only_while_running"


async def test_two_running_compensators_in_one_run_are_refused(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    await start_run(store, fence, TASKS)

    error = await _refused(
        store_dsn,
        f"UPDATE flowforge_task SET state = '{CompensationState.RUNNING}' "
        f"WHERE role = '{TaskRole.COMPENSATION}'",
    )

    assert isinstance(error, psycopg.errors.UniqueViolation)


async def test_every_state_of_the_domain_is_accepted_by_the_checks(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    """Keeps the CHECK lists and flowforge.domain.states in sync."""
    await start_run(store, fence, TASKS)
    async with await psycopg.AsyncConnection.connect(store_dsn) as connection:
        for state in TaskState:
            async with connection.transaction(force_rollback=True):
                await connection.execute(  # only an approval gate awaits
                    "UPDATE flowforge_task SET state = %s, pending_dependencies = 0, "
                    "approval = %s WHERE task_key = 'b'",
                    (str(state), state is TaskState.AWAITING),
                )
        # a task that is no gate never awaits; a gate is never ready or running (no Job)
        for state, gate in (
            (TaskState.AWAITING, False),
            (TaskState.READY, True),
            (TaskState.RUNNING, True),
        ):
            with pytest.raises(psycopg.errors.CheckViolation):
                async with connection.transaction(force_rollback=True):
                    await connection.execute(
                        "UPDATE flowforge_task SET state = %s, pending_dependencies = 0, "
                        "approval = %s WHERE task_key = 'b'",
                        (str(state), gate),
                    )
        for compensation_state in CompensationState:
            async with connection.transaction(force_rollback=True):
                await connection.execute(
                    "UPDATE flowforge_task SET state = %s WHERE task_key = 'undo-a'",
                    (str(compensation_state),),
                )
        for phase in RunPhase:
            async with connection.transaction(force_rollback=True):
                await connection.execute(
                    "UPDATE flowforge_run SET phase = %s, finished_at = CASE WHEN %s "
                    "THEN now() END",
                    (
                        str(phase),
                        phase in TERMINAL_RUN_PHASES,
                    ),
                )
        cursor = await connection.execute("SELECT count(*) FROM flowforge_task")
        assert await cursor.fetchone() == (4,)
