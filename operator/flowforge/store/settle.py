"""Settling a run: deciding, under the run's row lock, whether it is finished.

Once no forward task is unresolved, a run whose forward tasks all succeeded finishes
``succeeded``. Otherwise (a failure, or a cancel request) the compensators of the forward
tasks that succeeded become ``pending`` and the rest ``skipped``; the run stays ``running``
with ``compensating`` set until no compensator is pending or running, and then finishes
``failed`` (``cancelled`` after a cancel request). A run with nothing to compensate
finishes at once.

Outcome transactions do not lock the run row (that would serialise every outcome of a run
on its commit). Instead each one, after it commits, calls ``settle_run``: it checks without
a lock whether the run may be done and only then locks the run row and checks again. Of
two last tasks finishing together, the one that commits second always sees the first, so
the run is settled exactly once; the reconciler calls ``settle_run`` as the backstop for a
process that died between the two transactions.
"""

from __future__ import annotations

import dataclasses

from flowforge.domain.states import RunPhase
from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import RunNotFoundError
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence, check_fence
from flowforge.store.retry import in_transaction

UNRESOLVED_QUERY = """
SELECT EXISTS (
    SELECT 1 FROM flowforge_task
    WHERE run_id = %(run)s AND role = 'forward' AND state IN ('waiting', 'ready', 'running')
) OR EXISTS (
    SELECT 1 FROM flowforge_task
    WHERE run_id = %(run)s AND role = 'compensation' AND state IN ('pending', 'running')
)
"""


@dataclasses.dataclass(frozen=True)
class SettledRun:
    run_id: int
    phase: RunPhase
    compensating: bool
    compensators_triggered: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.phase in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED)


async def settle_locked(connection: Connection, *, fence: Fence, run_id: int) -> SettledRun:
    """Inside a transaction that passed the fence check: lock the run and settle it."""
    cursor = await connection.execute(
        "SELECT phase, compensating, cancel_requested FROM flowforge_run WHERE id = %s "
        "FOR NO KEY UPDATE",
        (run_id,),
    )
    row = await cursor.fetchone()
    if row is None:
        raise RunNotFoundError(run=f"#{run_id}")
    phase, compensating, cancel_requested = RunPhase(row[0]), bool(row[1]), bool(row[2])
    if phase not in (RunPhase.PENDING, RunPhase.RUNNING):
        return SettledRun(run_id=run_id, phase=phase, compensating=False)
    unresolved = await connection.execute(UNRESOLVED_QUERY, {"run": run_id})
    unresolved_row = await unresolved.fetchone()
    if unresolved_row is not None and unresolved_row[0]:
        return SettledRun(run_id=run_id, phase=phase, compensating=compensating)

    triggered: tuple[str, ...] = ()
    if not compensating:
        outcome = await connection.execute(
            "SELECT count(*) FILTER (WHERE state <> 'succeeded') FROM flowforge_task "
            "WHERE run_id = %s AND role = 'forward'",
            (run_id,),
        )
        outcome_row = await outcome.fetchone()
        not_succeeded = 0 if outcome_row is None else int(outcome_row[0])
        if not_succeeded == 0 and not cancel_requested:
            return await _finish(connection, fence=fence, run_id=run_id, phase=RunPhase.SUCCEEDED)
        triggered = await _trigger_compensation(connection, fence=fence, run_id=run_id)
        if triggered:
            await connection.execute(
                "UPDATE flowforge_run SET compensating = true, updated_at = now() WHERE id = %s",
                (run_id,),
            )
            await append_event(
                connection,
                run_id=run_id,
                kind="run.compensating",
                epoch=fence.epoch,
                detail={"order": list(triggered)},
            )
            return SettledRun(
                run_id=run_id,
                phase=RunPhase.RUNNING,
                compensating=True,
                compensators_triggered=triggered,
            )
    final = RunPhase.CANCELLED if cancel_requested else RunPhase.FAILED
    return await _finish(connection, fence=fence, run_id=run_id, phase=final)


async def _trigger_compensation(
    connection: Connection, *, fence: Fence, run_id: int
) -> tuple[str, ...]:
    """Compensators of succeeded forward tasks become pending; the rest are skipped."""
    cursor = await connection.execute(
        """
        UPDATE flowforge_task AS compensator
        SET state = CASE WHEN forward.state = 'succeeded' THEN 'pending' ELSE 'skipped' END,
            finished_at = CASE WHEN forward.state = 'succeeded' THEN NULL ELSE now() END,
            not_before = now(),
            updated_at = now()
        FROM flowforge_task AS forward
        WHERE compensator.run_id = %(run)s AND compensator.role = 'compensation'
          AND compensator.state = 'not_triggered'
          AND forward.run_id = %(run)s AND forward.task_key = compensator.compensates_key
        RETURNING compensator.task_key, compensator.state, compensator.topological_index
        """,
        {"run": run_id},
    )
    rows = await cursor.fetchall()
    pending = sorted(
        ((int(index), str(key)) for key, state, index in rows if state == "pending"),
        reverse=True,
    )
    skipped = sorted(str(key) for key, state, _ in rows if state == "skipped")
    order = tuple(key for _, key in pending)
    await append_task_events(
        connection,
        run_id=run_id,
        kind="compensation.triggered",
        epoch=fence.epoch,
        task_keys=order,
    )
    await append_task_events(
        connection, run_id=run_id, kind="compensation.skipped", epoch=fence.epoch, task_keys=skipped
    )
    return order


async def _finish(
    connection: Connection, *, fence: Fence, run_id: int, phase: RunPhase
) -> SettledRun:
    await connection.execute(
        "UPDATE flowforge_run SET phase = %s, compensating = false, finished_at = now(), "
        "updated_at = now() WHERE id = %s",
        (phase, run_id),
    )
    await append_event(connection, run_id=run_id, kind=f"run.{phase}", epoch=fence.epoch)
    return SettledRun(run_id=run_id, phase=phase, compensating=False)


async def settle_run(pool: Pool, *, fence: Fence, run_id: int) -> SettledRun | None:
    """Finish the run or start its rollback if its tasks allow; None while work remains.

    Cheap when the run still has work: one read-only probe of the progress index.
    """
    async with pool.connection() as connection:
        probe = await connection.execute(UNRESOLVED_QUERY, {"run": run_id})
        probe_row = await probe.fetchone()
        await connection.rollback()
    if probe_row is not None and probe_row[0]:
        return None

    async def decide(connection: Connection) -> SettledRun:
        await check_fence(connection, fence)
        return await settle_locked(connection, fence=fence, run_id=run_id)

    return await in_transaction(pool, decide)
