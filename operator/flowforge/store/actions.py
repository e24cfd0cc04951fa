"""A person's WorkflowRunAction, applied inside the run's transaction, once.

``apply_action`` takes the run's locks in the store's one order (``moves.locked_move``),
looks in the run's history for the action's uid (an action already processed is answered
with its earlier result and changes nothing: a re-applied or replayed action is a no-op),
judges the preconditions (``flowforge.domain.run_actions``) and either refuses (the history
says so, nothing else changes) or applies the action and records it, then settles the run
in the same transaction: a recovered rollback starts its next compensator at once.

**RetryCompensator**: the halted compensator goes back to pending with its attempt + 1 and
fresh attempts (its own ``retries + 1``, read from the run's stored definition);
**SkipCompensator**: it is skipped, by a person, with the reason. Then the compensators
the halt skipped (triggered ones: their ``undo_of`` is set) are pending again, and the
run is ``recovering``: its rollback runs again while it keeps the phase it ended in
(``settle._recovered`` records when the rollback settled). **Pause** and **Resume**:
``pausing.py``. **Approve** and **Reject** of an approval gate: ``approvals.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flowforge.domain import notices
from flowforge.domain.decision import Decision
from flowforge.domain.for_each import split_instance
from flowforge.domain.history import EventKind
from flowforge.domain.run_actions import (
    GATE_ACTIONS,
    PAUSE_ACTIONS,
    RECOVERY_ACTIONS,
    ActionResult,
    Actor,
    RunAction,
    RunActionKind,
    recovery_refusal,
)
from flowforge.domain.states import CompensationState, RunPhase
from flowforge.store.approvals import decide_gate_locked
from flowforge.store.connection import Connection, Pool
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence
from flowforge.store.moves import locked_move
from flowforge.store.pausing import pause_or_resume_locked
from flowforge.store.settle import settle_locked

PROCESSED_QUERY = f"""
SELECT kind, detail->>'message' FROM flowforge_event
WHERE run_id = %(run)s AND kind IN ('{EventKind.ACTION_ACCEPTED}', '{EventKind.ACTION_REFUSED}')
  AND detail->>'uid' = %(uid)s
LIMIT 1
"""

# the compensators a halt skipped: triggered (undo_of set), skipped, never started
RESUME_QUERY = f"""
UPDATE flowforge_task SET state = '{CompensationState.PENDING}', finished_at = NULL,
    not_before = now(), updated_at = now()
WHERE run_id = %(run)s AND role = 'compensation' AND state = '{CompensationState.SKIPPED}'
  AND undo_of IS NOT NULL AND started_at IS NULL
RETURNING task_key
"""


# a compensator's attempts per round: its retries + 1, from the run's stored definition (for
# the compensator of a forEach item, ``undo[eu]``, its task's: ``undo``)
FRESH_ATTEMPTS_QUERY = """
SELECT coalesce((task->>'retries')::int, 0) + 1
FROM flowforge_run AS run
JOIN flowforge_definition AS definition ON definition.id = run.definition_id,
     jsonb_array_elements(definition.document->'tasks') AS task
WHERE run.id = %s AND task->>'key' = %s
"""


@dataclasses.dataclass(frozen=True)
class ActionOutcome:
    """What became of an action: its result and message, the moves it made (``decision``),
    and whether it had been processed before (then nothing was done now)."""

    result: ActionResult
    message: str
    decision: Decision
    already: bool = False

    @property
    def accepted(self) -> bool:
        return self.result is ActionResult.ACCEPTED


async def apply_action(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    uid: str,
    name: str,
    action: RunAction,
    actor: Actor,
) -> ActionOutcome:
    """Apply the WorkflowRunAction ``name`` (object uid ``uid``) to the run, once."""
    outcome: list[ActionOutcome] = []

    async def move(connection: Connection, _namespace: str) -> Decision:
        cursor = await connection.execute(PROCESSED_QUERY, {"run": run_id, "uid": uid})
        seen = await cursor.fetchone()
        if seen is not None:
            result = (
                ActionResult.ACCEPTED
                if seen[0] == EventKind.ACTION_ACCEPTED
                else ActionResult.REFUSED
            )
            outcome.append(ActionOutcome(result, str(seen[1] or ""), Decision.lost(), True))
            return Decision.lost()
        said = ""
        if action.action in PAUSE_ACTIONS:
            refusal, decision = await pause_or_resume_locked(
                connection, fence=fence, run_id=run_id, action=action, actor=actor
            )
        elif action.action in GATE_ACTIONS:
            refusal, said, decision = await decide_gate_locked(
                connection, fence=fence, run_id=run_id, action=action, actor=actor
            )
        else:
            refusal, decision = await _judge(connection, fence=fence, run_id=run_id, action=action)
        accepted = refusal is None
        message = refusal or said or _accepted_message(action)
        detail: dict[str, Any] = {
            "uid": uid,
            "name": name,
            "action": action.action.value,
            "actor": actor.to_dict(),
            "reason": action.reason,
            "message": message,
        }
        if action.compensator is not None:
            detail["compensator"] = action.compensator
        if action.task is not None:
            detail["task"] = action.task
        await append_event(
            connection,
            run_id=run_id,
            kind=EventKind.ACTION_ACCEPTED if accepted else EventKind.ACTION_REFUSED,
            epoch=fence.epoch,
            task_key=action.compensator or action.task,
            detail=detail,
        )
        notice = notices.action_processed(
            action=action.action.value, actor=actor.username, accepted=accepted, message=message
        )
        result = ActionResult.ACCEPTED if accepted else ActionResult.REFUSED
        outcome.append(ActionOutcome(result, message, decision))
        noted = Decision(recorded=True, notices=(notice,))
        if not accepted:  # a refusal changes nothing: the run is not even settled
            return noted
        return noted.then(decision).then(
            await settle_locked(connection, fence=fence, run_id=run_id)
        )

    decision = await locked_move(pool, fence=fence, run_id=run_id, move=move)
    if not outcome:  # the run is not in the store
        return ActionOutcome(ActionResult.REFUSED, "the run is not in the store", Decision.lost())
    return dataclasses.replace(outcome[0], decision=decision)


def _accepted_message(action: RunAction) -> str:
    if action.action is RunActionKind.PAUSE:
        return "paused: no task or compensator starts until the run is resumed"
    if action.action is RunActionKind.RESUME:
        return "resumed: what was held starts now (and a cancel asked meanwhile is applied)"
    if action.action is RunActionKind.RETRY_COMPENSATOR:
        return f"compensator {action.compensator} runs again; the rollback goes on"
    return f"compensator {action.compensator} skipped: {action.reason}; the rollback goes on"


async def _judge(
    connection: Connection, *, fence: Fence, run_id: int, action: RunAction
) -> tuple[str | None, Decision]:
    """Refuse (the reason) or apply the action under the run's lock."""
    assert action.action in RECOVERY_ACTIONS
    cursor = await connection.execute(
        "SELECT phase, compensating OR recovering FROM flowforge_run "
        "WHERE id = %s FOR NO KEY UPDATE",
        (run_id,),
    )
    run = await cursor.fetchone()
    assert run is not None  # locked_move found it
    tasks = await connection.execute(
        "SELECT task_key, state FROM flowforge_task "
        "WHERE run_id = %s AND role = 'compensation' FOR NO KEY UPDATE",
        (run_id,),
    )
    states = {str(key): CompensationState(state) for key, state in await tasks.fetchall()}
    assert action.compensator is not None  # parse_action requires it
    refusal = recovery_refusal(
        phase=RunPhase(run[0]),
        compensating=bool(run[1]),
        compensator=action.compensator,
        states=states,
    )
    if refusal is not None:
        return refusal, Decision.lost()
    who = {"reason": action.reason, "byPerson": True}
    if action.action is RunActionKind.RETRY_COMPENSATOR:
        task, _ = split_instance(action.compensator)
        fresh = await connection.execute(FRESH_ATTEMPTS_QUERY, (run_id, task))
        fresh_row = await fresh.fetchone()
        await connection.execute(
            f"UPDATE flowforge_task SET state = '{CompensationState.PENDING}', "
            "attempt = attempt + 1, max_attempts = attempt + %s, finished_at = NULL, "
            "not_before = now(), updated_at = now() "
            "WHERE run_id = %s AND role = 'compensation' AND task_key = %s",
            (int(fresh_row[0]) if fresh_row else 1, run_id, action.compensator),
        )
        await append_event(
            connection,
            run_id=run_id,
            kind=EventKind.COMPENSATION_RETRIED,
            epoch=fence.epoch,
            task_key=action.compensator,
            detail=who,
        )
    else:
        await connection.execute(
            f"UPDATE flowforge_task SET state = '{CompensationState.SKIPPED}', "
            "updated_at = now() WHERE run_id = %s AND role = 'compensation' AND task_key = %s",
            (run_id, action.compensator),
        )
        await append_event(
            connection,
            run_id=run_id,
            kind=EventKind.COMPENSATION_SKIPPED,
            epoch=fence.epoch,
            task_key=action.compensator,
            detail=who,
        )
    resumed = await connection.execute(RESUME_QUERY, {"run": run_id})
    keys = sorted(str(key) for (key,) in await resumed.fetchall())
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.COMPENSATION_RESUMED,
        epoch=fence.epoch,
        task_keys=keys,
    )
    await connection.execute(
        "UPDATE flowforge_run SET recovering = true, updated_at = now() WHERE id = %s",
        (run_id,),
    )
    return None, Decision(recorded=True)


async def recovery_note(pool: Pool, run_id: int) -> str | None:
    """The latest accepted action on the run's rollback, as people read it (who, what, why);
    None when nobody acted."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT detail FROM flowforge_event WHERE run_id = %s AND kind = %s "
            "ORDER BY id DESC LIMIT 1",
            (run_id, EventKind.ACTION_ACCEPTED),
        )
        row = await cursor.fetchone()
    if row is None:
        return None
    detail = row[0]
    note = (
        f"{detail.get('action')} of {detail.get('compensator')} by "
        f"{(detail.get('actor') or {}).get('username')}"
    )
    return note + (f": {detail['reason']}" if detail.get("reason") else "")
