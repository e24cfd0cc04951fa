"""The skeleton every locked move of a run shares, so its lock order is written once.

The store's central invariant is one lock order (``queue.py``): the fence (the lease row
``FOR KEY SHARE``), then the run's namespace (a transaction-level advisory lock), then the
run's row, then its task rows in id order. A move (record a failed attempt, hand a freed slot on,
cancel, dispatch, settle) supplies only its own middle part, which takes the run row and task
rows; ``locked_move`` takes what comes before it and, after it, settles the run and gives the
slots it freed to the namespace's other runs, in that order, in the same transaction.

The success hot path (``outcomes.RECORD_SUCCESS_QUERY``) is one statement that takes no
namespace lock; it is the one move outside this skeleton.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from flowforge.domain.decision import Decision
from flowforge.domain.states import UNRESOLVED_TASK_STATES, TaskState, sql_list
from flowforge.store.connection import Connection, Pool
from flowforge.store.gates import GATE_DEADLINE
from flowforge.store.lease import Fence, check_fence
from flowforge.store.queue import fill_locked, lock_namespace_of_run
from flowforge.store.settle import settle_locked
from flowforge.store.transaction import in_transaction

# a move's own part: the transaction's connection and the run's namespace (its lock held)
Move = Callable[[Connection, str], Awaitable[Decision]]


async def locked_move(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    move: Move,
    settle: bool = False,
    fill: bool = False,
    gates: bool = True,
) -> Decision:
    """Run ``move`` in one transaction in the lock order above; then settle the run when the
    move recorded something (``settle``; ``gates``: the run may have approval gates, as for
    ``settle_locked``), and fill the namespace's free slots with its other runs (``fill``).
    ``Decision.lost()`` when the run does not exist."""

    async def decide(connection: Connection) -> Decision:
        await check_fence(connection, fence)
        namespace = await lock_namespace_of_run(connection, run_id)
        if namespace is None:
            return Decision.lost()
        decision = await move(connection, namespace)
        if settle and decision.recorded:
            decision = decision.then(
                await settle_locked(connection, fence=fence, run_id=run_id, gates=gates)
            )
        if fill:  # a freed slot, or nothing: filling finds out
            decision = decision.also(
                await fill_locked(connection, fence=fence, namespace=namespace, skip=run_id)
            )
        return decision

    return await in_transaction(pool, decide)


# whether the run still has forward work
WORK_PROBE_QUERY = f"""
SELECT EXISTS (SELECT 1 FROM flowforge_task WHERE run_id = %(run)s
               AND role = 'forward' AND state IN {sql_list(UNRESOLVED_TASK_STATES)})
"""
# ... and no approval gate whose timeout passed (the settle fails that, ``gates.py``)
SETTLE_PROBE_QUERY = f"""{WORK_PROBE_QUERY}
   AND NOT EXISTS (SELECT 1 FROM flowforge_task WHERE run_id = %(run)s AND role = 'forward'
                   AND state = '{TaskState.AWAITING}' AND {GATE_DEADLINE} <= now())
"""


async def settle_run(pool: Pool, *, fence: Fence, run_id: int, gates: bool = True) -> Decision:
    """Finish the run, start its rollback or its next compensator if its tasks allow
    (``gates``: its definition may have approval gates; False: none can be overdue).

    Cheap when the run still has forward work: one read-only probe of the progress index.
    """
    async with pool.connection() as connection:
        probe = await connection.execute(
            SETTLE_PROBE_QUERY if gates else WORK_PROBE_QUERY, {"run": run_id}
        )
        probe_row = await probe.fetchone()
    if probe_row is not None and probe_row[0]:
        return Decision.lost()

    return await locked_move(
        pool,
        fence=fence,
        run_id=run_id,
        move=lambda connection, _: settle_locked(
            connection, fence=fence, run_id=run_id, gates=gates
        ),
    )
