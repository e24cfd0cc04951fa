"""Settling a run: under its row lock, bring it to its next resting state.

Once no forward task is unresolved, a run whose forward tasks all succeeded finishes
``Succeeded`` (``flowforge.domain.projection.settled_phase`` decides). Otherwise (a failure,
or a cancel request) the compensators of the forward tasks that succeeded become
``pending`` (and, with ``compensateOn: Attempted``, those of tasks whose last attempt failed
after its container started: ``flowforge.domain.undo``) and the rest ``skipped``, the run
stays ``Running`` with ``compensating`` set, and the first compensator starts. While
compensating, each settle starts the next pending compensator (those undoing an attempted
task first, then the one whose forward task comes last in the topological order, i.e. the
smallest rollback position; a forEach compensator's items the one completed last first)
once none is running and its backoff is over; when none is
pending or running, the run finishes ``Failed`` (``Cancelled`` after a cancel request).
A run with nothing to compensate finishes at once. The rollback is strictly one at a time:
the run's row lock orders concurrent settles and a unique partial index
(``flowforge_task_one_running_compensator_idx``) makes a second running compensator
impossible.

The success hot path does not lock the run row (that would serialise every outcome of a
run on its commit). Instead, after it commits, ``settle_run`` checks without a lock whether
the run may be done and only then locks the run row and checks again. Of two last tasks
finishing together, the one that commits second always sees the first, so the run is
settled exactly once. A move that decides under the run's lock before it commits (a final
failure) could miss a success that commits and probes in between: its count sees that task
still running, and the success's probe sees the failed task still running. So a settle that
finds unresolved tasks locks one of them ``FOR SHARE`` before it concludes the run goes on:
a success that already updated the row is waited for (and the row no longer counts), a
later one waits for this commit and then settles. The reconciler calls ``settle_run`` as
the backstop for a process that died between the two transactions, and for a rollback to
resume after a restart. A run that finishes hands its slot on in the same transaction: the
namespace's queued runs that may start now do, and a queued ``Replace`` run cancels the
oldest of its key (``queue.py``; every caller holds the namespace's lock, taken before the
run's row lock).
"""

from __future__ import annotations

from flowforge.domain import notices
from flowforge.domain.decision import Decision, Dispatch
from flowforge.domain.history import EventKind
from flowforge.domain.projection import TaskCounts, settled_phase
from flowforge.domain.states import (
    TERMINAL_RUN_PHASES,
    UNRESOLVED_COMPENSATION_STATES,
    UNRESOLVED_TASK_STATES,
    CompensationState,
    RunPhase,
    TaskState,
    sql_list,
)
from flowforge.domain.undo import UndoOf
from flowforge.store.attempts import Step, attempt_columns, read_rows, seconds_until
from flowforge.store.connection import Connection, Pool
from flowforge.store.events import append_event, append_task_events
from flowforge.store.final_tasks import begin_finally_locked, next_final_step_locked
from flowforge.store.gates import expire_gates_locked
from flowforge.store.lease import Fence
from flowforge.store.queries import UNDONE_AS_ATTEMPTED, forward_counts_locked
from flowforge.store.queue import rebalance_locked

UNRESOLVED_QUERY = f"""
SELECT EXISTS (
    SELECT 1 FROM flowforge_task
    WHERE run_id = %(run)s AND role = 'forward' AND state IN {sql_list(UNRESOLVED_TASK_STATES)}
) OR EXISTS (
    SELECT 1 FROM flowforge_task
    WHERE run_id = %(run)s AND role = 'compensation'
      AND state IN {sql_list(UNRESOLVED_COMPENSATION_STATES)}
)
"""

# a compensator runs when its task succeeded, or (compensateOn: Attempted) when its task's
# last attempt failed after its container started: ``flowforge.domain.undo.undo_of``
_UNDO_OF = f"""CASE WHEN forward.state = '{TaskState.SUCCEEDED}' THEN '{UndoOf.SUCCEEDED}'
                 WHEN {UNDONE_AS_ATTEMPTED} THEN '{UndoOf.ATTEMPTED}' END"""

TRIGGER_QUERY = f"""
UPDATE flowforge_task AS compensator
SET state = CASE WHEN {_UNDO_OF} IS NOT NULL
                 THEN '{CompensationState.PENDING}' ELSE '{CompensationState.SKIPPED}' END,
    finished_at = CASE WHEN {_UNDO_OF} IS NOT NULL THEN NULL ELSE now() END,
    undo_of = {_UNDO_OF},
    not_before = now(),
    updated_at = now()
FROM flowforge_task AS forward
WHERE compensator.run_id = %(run)s AND compensator.role = 'compensation'
  AND compensator.state = '{CompensationState.NOT_TRIGGERED}'
  AND forward.run_id = %(run)s AND forward.task_key = compensator.compensates_key
RETURNING compensator.task_key, compensator.state, compensator.topological_index,
          compensator.undo_of, forward.finished_at
"""

# the rollback's order (``flowforge.domain.undo.rollback_order``): the undoing of attempted
# tasks first, then the rollback positions; a forEach compensator's instances share one
# position, and undo the items in reverse order of their completion (the forward rows'
# finish). ``compensator`` and ``forward`` name the two rows.
ROLLBACK_ORDER = (
    f"compensator.undo_of IS NOT DISTINCT FROM '{UndoOf.ATTEMPTED}' DESC, "
    "compensator.topological_index, forward.finished_at DESC, compensator.task_key"
)

# whether a run without successes has a task a compensator may undo as attempted
ATTEMPTED_QUERY = f"""
SELECT EXISTS (
    SELECT 1 FROM flowforge_task AS compensator
    JOIN flowforge_task AS forward ON forward.run_id = compensator.run_id
     AND forward.task_key = compensator.compensates_key
    WHERE compensator.run_id = %(run)s AND compensator.role = 'compensation'
      AND {UNDONE_AS_ATTEMPTED}
)
"""

# a settle that finds the run still running holds one of its unresolved tasks until it
# commits: the outcome of that task (the hot path's UPDATE) waits for the commit, so the
# settle after that outcome sees this transaction's changes (see the module)
HOLD_UNRESOLVED_QUERY = f"""
SELECT id FROM flowforge_task
WHERE run_id = %(run)s AND role = 'forward' AND state IN {sql_list(UNRESOLVED_TASK_STATES)}
LIMIT 1 FOR SHARE
"""

# the compensator whose turn it is: the smallest rollback position among the pending
NEXT_STEP_QUERY = f"""
SELECT compensator.id AS task_id, {attempt_columns("compensator")},
       compensator.not_before <= now() AS due,
       {seconds_until("compensator.not_before")} AS due_in,
       EXISTS (SELECT 1 FROM flowforge_task WHERE run_id = %(run)s AND role = 'compensation'
               AND state = '{CompensationState.RUNNING}') AS busy
FROM flowforge_task AS compensator
JOIN flowforge_task AS forward
  ON forward.run_id = compensator.run_id AND forward.task_key = compensator.compensates_key
WHERE compensator.run_id = %(run)s AND compensator.role = 'compensation'
  AND compensator.state = '{CompensationState.PENDING}'
ORDER BY {ROLLBACK_ORDER}
LIMIT 1
"""

START_STEP_QUERY = f"""
UPDATE flowforge_task SET state = '{CompensationState.RUNNING}', started_at = now(),
    updated_at = now()
WHERE id = %s AND state = '{CompensationState.PENDING}'
"""


async def settle_locked(
    connection: Connection, *, fence: Fence, run_id: int, gates: bool = True
) -> Decision:
    """Inside a transaction that passed the fence check: lock the run and settle it.
    ``Decision.lost()`` when there is nothing to do yet (or the run is over). ``gates``:
    the run's definition may have approval gates (False: none can be overdue, no need to
    look)."""
    cursor = await connection.execute(
        "SELECT phase, compensating, cancel_requested, namespace, recovering, paused, "
        "final_phase FROM flowforge_run WHERE id = %s FOR NO KEY UPDATE",
        (run_id,),
    )
    row = await cursor.fetchone()
    if row is None:
        return Decision.lost()
    compensating, cancel_requested, paused = bool(row[1]), bool(row[2]), bool(row[5])
    if row[6] is not None and RunPhase(row[0]) not in TERMINAL_RUN_PHASES:
        # the outcome is decided: its finally tasks run, then it takes the phase
        step = await next_final_step_locked(connection, fence=fence, run_id=run_id, paused=paused)
        if step is not None:
            return step
        return await _finish(
            connection, fence=fence, run_id=run_id, phase=RunPhase(row[6]), decided=True
        )
    if RunPhase(row[0]) in TERMINAL_RUN_PHASES:
        if not row[4]:
            return Decision.lost()
        # an ended run whose halted rollback a person recovered (flowforge.store.actions)
        return await _next_step(
            connection, fence=fence, run_id=run_id, cancel=cancel_requested, ended=True
        )
    if compensating:
        return await _next_step(
            connection, fence=fence, run_id=run_id, cancel=cancel_requested, paused=paused
        )
    expired = (
        await expire_gates_locked(connection, fence=fence, run_id=run_id)
        if gates
        else Decision.lost()
    )
    return expired.then(
        await _settle_forward(
            connection, fence=fence, run_id=run_id, cancel_requested=cancel_requested, paused=paused
        )
    )


async def _settle_forward(
    connection: Connection, *, fence: Fence, run_id: int, cancel_requested: bool, paused: bool
) -> Decision:
    """A run whose rollback has not started: finish it, or start its rollback, once no
    forward task is unresolved."""
    counts = await forward_counts_locked(connection, run_id)
    if counts.unresolved:
        holding = await connection.execute(HOLD_UNRESOLVED_QUERY, {"run": run_id})
        if await holding.fetchone() is None:
            # each task counted unresolved was resolved by a commit while we counted
            counts = await forward_counts_locked(connection, run_id)
    phase = settled_phase(counts=counts, cancel_requested=cancel_requested)
    if phase is RunPhase.RUNNING:
        return Decision.lost()
    if phase is RunPhase.SUCCEEDED:
        return await _finish(connection, fence=fence, run_id=run_id, phase=phase)
    return await _start_rollback(
        connection, fence=fence, run_id=run_id, phase=phase, counts=counts, paused=paused
    )


async def _start_rollback(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    phase: RunPhase,
    counts: TaskCounts,
    paused: bool,
) -> Decision:
    """Trigger the compensators of the tasks that succeeded, and start the first (unless a
    person paused the run: its resume does)."""
    triggered = (
        await _trigger(connection, fence=fence, run_id=run_id)
        if counts.succeeded or await _attempted(connection, run_id=run_id)
        else ()
    )
    if not triggered:
        return await _finish(connection, fence=fence, run_id=run_id, phase=phase)
    await connection.execute(
        "UPDATE flowforge_run SET compensating = true, updated_at = now() WHERE id = %s",
        (run_id,),
    )
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_COMPENSATING,
        epoch=fence.epoch,
        detail={"order": list(triggered)},
    )
    started = Decision(recorded=True, notices=(notices.rollback_started(triggered),))
    return started.then(
        await _next_step(
            connection,
            fence=fence,
            run_id=run_id,
            cancel=phase is RunPhase.CANCELLED,
            paused=paused,
        )
    )


async def _attempted(connection: Connection, *, run_id: int) -> bool:
    cursor = await connection.execute(ATTEMPTED_QUERY, {"run": run_id})
    row = await cursor.fetchone()
    return bool(row and row[0])


async def _trigger(connection: Connection, *, fence: Fence, run_id: int) -> tuple[str, ...]:
    """Compensators of succeeded (or attempted) forward tasks become pending, the rest are
    skipped; returns the pending ones in the order the rollback runs them."""
    cursor = await connection.execute(TRIGGER_QUERY, {"run": run_id})
    rows = await cursor.fetchall()
    order = tuple(
        key
        for *_, key in sorted(
            (
                undo != UndoOf.ATTEMPTED,
                int(position),
                -finished.timestamp() if finished is not None else 0.0,
                str(key),
            )
            for key, state, position, undo, finished in rows
            if state == CompensationState.PENDING
        )
    )
    skipped = sorted(str(key) for key, state, *_ in rows if state == CompensationState.SKIPPED)
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.COMPENSATION_TRIGGERED,
        epoch=fence.epoch,
        task_keys=order,
    )
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.COMPENSATION_SKIPPED,
        epoch=fence.epoch,
        task_keys=skipped,
    )
    return order


async def _next_step(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    cancel: bool,
    ended: bool = False,
    paused: bool = False,
) -> Decision:
    """Start the compensator whose turn it is (not while a person has paused the run);
    finish the run when none is left (or, for a run that had ``ended`` and whose rollback a
    person recovered, record that it settled)."""
    steps = await read_rows(connection, Step, NEXT_STEP_QUERY, {"run": run_id})
    if not steps:
        unresolved = await connection.execute(UNRESOLVED_QUERY, {"run": run_id})
        still = await unresolved.fetchone()
        if still is not None and still[0]:
            return Decision.lost()  # a compensator is running
        if ended:
            return await _recovered(connection, fence=fence, run_id=run_id)
        phase = RunPhase.CANCELLED if cancel else RunPhase.FAILED
        return await _finish(connection, fence=fence, run_id=run_id, phase=phase)
    step = steps[0]
    if step.busy or paused:
        return Decision.lost()
    if not step.due:
        return Decision(recorded=True, wake_in=step.due_in)
    await connection.execute(START_STEP_QUERY, (step.task_id,))
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.COMPENSATION_STARTED,
        epoch=fence.epoch,
        task_key=step.task_key,
        attempt=step.attempt,
    )
    return Decision(recorded=True, create_jobs=(Dispatch.of(step),))


async def _recovered(connection: Connection, *, fence: Fence, run_id: int) -> Decision:
    """A rollback a person recovered (``flowforge.store.actions``) has settled: completed, or
    halted again. The run keeps the phase it ended in."""
    await connection.execute(
        "UPDATE flowforge_run SET recovering = false, updated_at = now() WHERE id = %s",
        (run_id,),
    )
    cursor = await connection.execute(
        f"SELECT task_key FROM flowforge_task WHERE run_id = %s AND role = 'compensation' "
        f"AND state = '{CompensationState.FAILED}' ORDER BY task_key LIMIT 1",
        (run_id,),
    )
    halted = await cursor.fetchone()
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_ROLLBACK_RECOVERED,
        epoch=fence.epoch,
        detail={"completed": halted is None, "haltedAt": None if halted is None else halted[0]},
    )
    notice = notices.rollback_recovered(halted_at=None if halted is None else str(halted[0]))
    return Decision(recorded=True, notices=(notice,))


async def _finish(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    phase: RunPhase,
    decided: bool = False,
) -> Decision:
    """Finish the run, unless its ``finally`` tasks are to run first (``decided``: they
    have run); its slot goes to the next queued run of its namespace at once (the caller
    holds the namespace's lock, ``queue.py``)."""
    if not decided:
        begun = await begin_finally_locked(connection, fence=fence, run_id=run_id, phase=phase)
        if begun is not None:
            return begun
    cursor = await connection.execute(
        "UPDATE flowforge_run AS run SET phase = %s, compensating = false, finalizing = false, "
        "finished_at = now(), queue_reason = NULL, updated_at = now() "
        "FROM (SELECT phase FROM flowforge_run WHERE id = %s) AS before "
        "WHERE run.id = %s RETURNING run.namespace, before.phase = %s",
        (phase, run_id, run_id, RunPhase.QUEUED),
    )
    row = await cursor.fetchone()
    await append_event(
        connection, run_id=run_id, kind=EventKind.run_finished(phase), epoch=fence.epoch
    )
    finished = Decision(recorded=True, phase=phase, notices=(notices.run_finished(phase),))
    if row is None:
        return finished
    return finished.also(
        await rebalance_locked(
            connection,
            fence=fence,
            namespace=str(row[0]),
            skip=run_id,
            settle=settle_locked,
            changed=bool(row[1]),  # a queued run left the queue: the places behind it moved
        )
    )


async def undo_reason(pool: Pool, *, run_id: int, task_key: str) -> UndoOf:
    """Why the triggered compensator ``task_key`` runs (its ``FLOWFORGE_UNDO_OF``)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT undo_of FROM flowforge_task "
            "WHERE run_id = %s AND task_key = %s AND role = 'compensation'",
            (run_id, task_key),
        )
        row = await cursor.fetchone()
    return UndoOf(row[0]) if row is not None and row[0] else UndoOf.SUCCEEDED
