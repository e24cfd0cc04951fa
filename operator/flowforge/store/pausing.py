"""Pausing a run (a person's WorkflowRunAction Pause/Resume, ``flowforge.store.actions``).

``flowforge_run.paused`` holds every start: the success hot path releases dependents as
``ready`` instead of ``running`` (``outcomes.py``), the locked dispatch skips the run
(``queue.py::DISPATCH_QUERY``) and the rollback does not start its next compensator
(``settle.py``). Nothing else changes: running Jobs finish and their outcomes are recorded,
timeouts keep counting, retries come due, a run whose work is all done finishes (and so
is not paused any more: the flag only matters while it runs).

A cancel asked while the run is paused is kept (``deferred_cancel``, its reason) and applied
by the resume, in the resume's transaction: the running Jobs are stopped then, and the
rollback starts. A run whose WorkflowRun object is gone is cancelled at once (its Jobs are
gone with the object).
"""

from __future__ import annotations

from flowforge.domain import notices
from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.run_actions import Actor, RunAction, RunActionKind, pause_refusal
from flowforge.domain.states import RunPhase
from flowforge.store.connection import Connection
from flowforge.store.events import append_event
from flowforge.store.lease import Fence
from flowforge.store.queue import dispatch_locked
from flowforge.store.stopping import request_cancel


async def pause_or_resume_locked(
    connection: Connection, *, fence: Fence, run_id: int, action: RunAction, actor: Actor
) -> tuple[str | None, Decision]:
    """Inside a transaction that holds the namespace's lock: refuse (why) or apply a Pause or
    Resume of the run. A resume starts what is due and applies a deferred cancel; the caller
    settles the run afterwards (a rollback's next compensator)."""
    cursor = await connection.execute(
        "SELECT phase, paused, deferred_cancel FROM flowforge_run WHERE id = %s FOR NO KEY UPDATE",
        (run_id,),
    )
    row = await cursor.fetchone()
    assert row is not None  # locked_move found it
    paused, deferred = bool(row[1]), row[2]
    refusal = pause_refusal(action=action.action, phase=RunPhase(row[0]), paused=paused)
    if refusal is not None:
        return refusal, Decision.lost()
    pausing = action.action is RunActionKind.PAUSE
    await connection.execute(
        "UPDATE flowforge_run SET paused = %s, paused_at = CASE WHEN %s THEN now() END, "
        "deferred_cancel = NULL, updated_at = now() WHERE id = %s",
        (pausing, pausing, run_id),
    )
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_PAUSED if pausing else EventKind.RUN_RESUMED,
        epoch=fence.epoch,
        detail={"by": actor.username, "reason": action.reason},
    )
    if pausing:
        return None, Decision(recorded=True)
    resumed = Decision(recorded=True)
    if deferred is not None:
        resumed = await request_cancel(connection, fence=fence, run_id=run_id, reason=deferred)
    return None, resumed.then(await dispatch_locked(connection, fence=fence, run_id=run_id))


async def defer_cancel_locked(
    connection: Connection, *, fence: Fence, run_id: int, reason: str
) -> Decision | None:
    """Inside a transaction that holds the run's row lock: when the run is paused, keep the
    cancel for its resume (the decision; lost when one is kept already); None when it is
    not paused (cancel it now)."""
    cursor = await connection.execute(
        "SELECT paused, deferred_cancel IS NOT NULL FROM flowforge_run WHERE id = %s", (run_id,)
    )
    row = await cursor.fetchone()
    if row is None or not row[0]:
        return None
    if row[1]:
        return Decision.lost()
    await connection.execute(
        "UPDATE flowforge_run SET deferred_cancel = %s, updated_at = now() WHERE id = %s",
        (reason, run_id),
    )
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_CANCEL_DEFERRED,
        epoch=fence.epoch,
        detail={"reason": reason},
    )
    return Decision(recorded=True, notices=(notices.cancel_deferred(reason=reason),))
