"""A person's Approve or Reject of an approval gate, judged and applied under the run's lock.

Called by ``actions.apply_action`` inside the action's transaction (the run's locks taken
in the store's order, the action's uid not processed before). The gate's rules come from
the run's stored definition (``approval``), who created the run from the run's row
(``requested_by``), and who approved it already from the run's history: each accepted
``Approve`` is an ``action.accepted`` event with the actor's name, so a person counts once
however often they approve. The last approval ``required`` needs passes the gate with the
success statement (``outcomes.succeed_task`` from ``awaiting``), which releases its
dependents as any success does; a ``Reject`` fails it (``gates.fail_gate_locked``); the
settle the action is followed by then finishes the run or starts its rollback.
"""

from __future__ import annotations

from typing import Any

from flowforge.domain import notices
from flowforge.domain.approval import GateReason, approval_refusal, rejection_refusal
from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.models import ApprovalSpec
from flowforge.domain.run_actions import Actor, RunAction, RunActionKind
from flowforge.domain.states import RunPhase, TaskState
from flowforge.store.connection import Connection
from flowforge.store.gates import fail_gate_locked
from flowforge.store.lease import Fence
from flowforge.store.outcomes import succeed_task
from flowforge.store.queue import dispatch_locked

GATE_QUERY = """
SELECT run.phase, run.compensating, run.cancel_requested, run.requested_by,
       (SELECT task->'approval' FROM jsonb_array_elements(definition.document->'tasks') AS task
        WHERE task->>'key' = %(key)s)
FROM flowforge_run AS run
JOIN flowforge_definition AS definition ON definition.id = run.definition_id
WHERE run.id = %(run)s
FOR NO KEY UPDATE OF run
"""

APPROVED_BY_QUERY = f"""
SELECT DISTINCT detail->'actor'->>'username' FROM flowforge_event
WHERE run_id = %s AND kind = '{EventKind.ACTION_ACCEPTED}' AND task_key = %s
  AND detail->>'action' = '{RunActionKind.APPROVE}'
"""


async def decide_gate_locked(
    connection: Connection, *, fence: Fence, run_id: int, action: RunAction, actor: Actor
) -> tuple[str | None, str, Decision]:
    """Judge and apply an Approve or Reject: (the refusal, or None), the message when
    accepted, and the moves made."""
    gate = action.task
    assert gate is not None  # parse_action requires it
    cursor = await connection.execute(GATE_QUERY, {"run": run_id, "key": gate})
    run = await cursor.fetchone()
    assert run is not None  # locked_move found it
    phase, compensating, cancelling, creator, document = run
    if document is None:
        return f'the run has no approval gate "{gate}"', "", Decision.lost()
    if phase != RunPhase.RUNNING or compensating or cancelling:
        state = "rolling back" if compensating else "being cancelled" if cancelling else phase
        return f'the run is not waiting at "{gate}": it is {state}', "", Decision.lost()
    task = await connection.execute(
        "SELECT id, state, attempt FROM flowforge_task "
        "WHERE run_id = %s AND task_key = %s AND role = 'forward' FOR NO KEY UPDATE",
        (run_id, gate),
    )
    row = await task.fetchone()
    assert row is not None  # the definition has the gate, so the run has its row
    task_id, state, attempt = int(row[0]), str(row[1]), int(row[2])
    if state != TaskState.AWAITING:
        return f'"{gate}" is not awaiting approval: it is {state}', "", Decision.lost()
    approval = ApprovalSpec.model_validate(document)
    if action.action is RunActionKind.REJECT:
        refusal = rejection_refusal(gate=gate, approval=approval, actor=actor)
        if refusal is not None:
            return refusal, "", Decision.lost()
        message = f"rejected by {actor.username}: {action.reason}"
        failed = await fail_gate_locked(
            connection,
            fence=fence,
            run_id=run_id,
            task_id=task_id,
            task_key=gate,
            reason=GateReason.REJECTED,
            message=message,
        )
        return None, f"{gate} {message}; the run rolls back", failed
    approvers = await connection.execute(APPROVED_BY_QUERY, (run_id, gate))
    approved_by = sorted(str(name) for (name,) in await approvers.fetchall())
    refusal = approval_refusal(
        gate=gate, approval=approval, actor=actor, creator=creator, approved_by=approved_by
    )
    if refusal is not None:
        return refusal, "", Decision.lost()
    approved_by.append(actor.username)
    if len(approved_by) < approval.required:
        counted = (
            f"approval {len(approved_by)} of {approval.required} for {gate} "
            f"({', '.join(approved_by)}); waiting for {approval.required - len(approved_by)} more"
        )
        return None, counted, Decision(recorded=True)
    return (
        None,
        f"{gate} approved ({', '.join(approved_by)}); the run goes on",
        await _pass(
            connection,
            fence=fence,
            run_id=run_id,
            gate=gate,
            attempt=attempt,
            approved_by=approved_by,
        ),
    )


async def _pass(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    gate: str,
    attempt: int,
    approved_by: list[str],
) -> Decision:
    detail: dict[str, Any] = {"reason": "Approved", "approvedBy": approved_by}
    success = await succeed_task(
        connection,
        fence=fence,
        run_id=run_id,
        task_key=gate,
        attempt=attempt,
        from_state=TaskState.AWAITING,
        detail=detail,
    )
    if success is None:  # checked awaiting under its row lock: cannot happen
        return Decision.lost()
    passed = Decision(
        recorded=True, notices=(notices.gate_approved(gate=gate, approvers=approved_by),)
    )
    decision = passed.then(success.decision())
    if success.limited:  # under a task limit: the released tasks start within it
        decision = decision.then(await dispatch_locked(connection, fence=fence, run_id=run_id))
    return decision
