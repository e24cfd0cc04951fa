"""The limits of ``flowforge.domain.queue``, decided in the transaction that dispatches.

Every transaction that may start a run or a task, or free a slot, takes the namespace's
transaction-level advisory lock first (``lock_namespace_of_run``), before any row lock: two
transactions can then never both take the last slot of a namespace, a workflow key or a run,
whatever the operator process, its restarts or its leader changes, and the one lock order
(namespace, then run rows, then task rows) cannot deadlock. The success hot path
(``outcomes.py``) takes no lock: it only ever frees a slot, and dispatches nothing itself
for a run under a task limit (its released tasks stay ``ready`` for the locked dispatch
that follows).

- ``admit_locked``: the namespace's queued runs, by priority then age, leave the queue while
  the namespace's ``maxRunningRuns`` and their key's ``maxRuns`` allow; the rest get the
  reason that holds them.
- ``dispatch_locked``: a running run's due ``ready`` tasks, as many as the run's
  ``maxParallelTasks`` (capped by the namespace's) and the namespace's ``maxRunningTasks``
  leave room for, counting running forward tasks and compensators alike, and of a
  ``forEach``'s instances at most its ``maxParallel`` running (in item order).
- ``serve_locked``: one pass over the queue: ``admit_locked``, a queued ``Replace`` run's
  victims cancelled (``stopping.py::replace_locked``), the admitted runs' roots dispatched,
  and the held runs whose reason or place changed re-projected (a run left or joined the
  queue); passes happen when the queue may move, and once a reconciler pass per namespace.
- ``rebalance_locked``: after a slot freed, both, for the whole namespace; the decisions
  about other runs ride along in the freeing decision (``Decision.elsewhere``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Protocol

from flowforge.domain import notices
from flowforge.domain.decision import Decision, Dispatch, RunDecision
from flowforge.domain.history import EventKind
from flowforge.domain.queue import ConcurrencyPolicy, NamespaceLimits, QueueReason
from flowforge.domain.states import RunPhase, TaskState
from flowforge.store.attempts import Attempt, attempt_columns, read_rows, seconds_until
from flowforge.store.connection import Connection, Pool
from flowforge.store.duplicates import finish_waiting_duplicates_locked
from flowforge.store.events import append_event
from flowforge.store.gates import GATE_DEADLINE
from flowforge.store.lease import Fence, check_fence
from flowforge.store.stopping import replace_locked
from flowforge.store.transaction import in_transaction

_LOCK_PREFIX = "flowforge.namespace/"
# at most this many queued runs are looked at (and re-projected) per pass
QUEUE_WINDOW = 1000
# other runs of a namespace whose ready tasks one freed slot may start, per pass
FILL_WINDOW = 100

LOCK_NAMESPACE_QUERY = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
LOCK_NAMESPACE_OF_RUN_QUERY = (
    "SELECT namespace, pg_advisory_xact_lock(hashtextextended(%s || namespace, 0)) "
    "FROM flowforge_run WHERE id = %s"
)

DISPATCH_QUERY = f"""
WITH run AS (
    SELECT id, namespace, max_parallel_tasks FROM flowforge_run
    WHERE id = %(run)s AND phase = '{RunPhase.RUNNING}' AND NOT cancel_requested
      AND NOT paused
    FOR NO KEY UPDATE
), limits AS (
    SELECT max_running_tasks, max_parallel_tasks FROM flowforge_namespace_limits
    WHERE namespace = (SELECT namespace FROM run)
), room AS (
    -- least() ignores NULLs: an absent limit leaves room; both absent, NULL (no limit)
    SELECT least(
        least((SELECT max_parallel_tasks FROM run), (SELECT max_parallel_tasks FROM limits))
            - (SELECT count(*) FROM flowforge_task
               WHERE run_id = %(run)s AND state = '{TaskState.RUNNING}'),
        (SELECT max_running_tasks FROM limits)
            - (SELECT count(*) FROM flowforge_task AS task
               JOIN flowforge_run AS other ON other.id = task.run_id
               WHERE other.namespace = (SELECT namespace FROM run)
                 AND other.phase = '{RunPhase.RUNNING}' AND task.state = '{TaskState.RUNNING}'
                 AND (SELECT max_running_tasks FROM limits) IS NOT NULL)
    ) AS slots
), candidate AS (
    -- a forEach instance's place among the due ones of its group (maxParallel)
    SELECT id, topological_index, task_key, item_group, group_max_parallel,
           row_number() OVER (PARTITION BY item_group ORDER BY topological_index, task_key)
               AS place
    FROM flowforge_task
    WHERE run_id = (SELECT id FROM run) AND role = 'forward' AND state = '{TaskState.READY}'
      AND not_before <= now()
), due AS (
    SELECT task.id FROM flowforge_task AS task
    JOIN candidate ON candidate.id = task.id
    WHERE candidate.group_max_parallel IS NULL
       OR candidate.place <= candidate.group_max_parallel
          - (SELECT count(*) FROM flowforge_task AS sibling
             WHERE sibling.run_id = %(run)s AND sibling.item_group = candidate.item_group
               AND sibling.role = 'forward' AND sibling.state = '{TaskState.RUNNING}')
    ORDER BY candidate.topological_index, candidate.task_key
    LIMIT (SELECT greatest(coalesce(slots, 2147483647), 0) FROM room)
    FOR NO KEY UPDATE OF task
), moved AS (
    UPDATE flowforge_task AS task
    SET state = '{TaskState.RUNNING}', started_at = coalesce(task.started_at, now()),
        updated_at = now()
    FROM due WHERE task.id = due.id AND task.state = '{TaskState.READY}'
    RETURNING {attempt_columns("task")}
), recorded AS (
    INSERT INTO flowforge_event (run_id, namespace, task_key, attempt, kind, epoch)
    SELECT %(run)s, (SELECT namespace FROM flowforge_run WHERE id = %(run)s),
           task_key, attempt, '{EventKind.TASK_DISPATCHED}', %(epoch)s FROM moved
    ORDER BY task_key
)
SELECT {attempt_columns("moved")} FROM moved ORDER BY task_key
"""

# the next retry of the run whose backoff is not over yet, or the next timeout of an
# approval gate (`gates.py`; the settle of the wake-up fails it)
_DUE = f"CASE WHEN state = '{TaskState.READY}' THEN not_before ELSE {GATE_DEADLINE} END"
NEXT_DUE_QUERY = f"""
SELECT {seconds_until(f"min({_DUE})")}
FROM flowforge_task
WHERE run_id = %s AND role = 'forward'
  AND ((state = '{TaskState.READY}' AND not_before > now())
       OR (state = '{TaskState.AWAITING}' AND {GATE_DEADLINE} > now()))
"""

LIMITS_QUERY = (
    "SELECT max_running_runs, max_running_tasks, max_parallel_tasks "
    "FROM flowforge_namespace_limits WHERE namespace = %s"
)

# (a duplicate of an unfinished run waits in the queue too, but never leaves it by a slot)
QUEUED_QUERY = f"""
SELECT id, name, concurrency_key, max_runs, concurrency_policy, queue_reason FROM flowforge_run
WHERE namespace = %s AND phase = '{RunPhase.QUEUED}' AND duplicate_of IS NULL
ORDER BY priority DESC, submitted_at, id
LIMIT {QUEUE_WINDOW}
"""

RUNNING_KEYS_QUERY = f"""
SELECT concurrency_key, count(*), count(*) FILTER (WHERE cancel_requested)
FROM flowforge_run WHERE namespace = %s AND phase = '{RunPhase.RUNNING}'
GROUP BY concurrency_key
"""

# the oldest running runs of a key that nobody asked to cancel yet: Replace's victims
OLDEST_RUNNING_QUERY = f"""
SELECT id FROM flowforge_run
WHERE namespace = %s AND concurrency_key = %s AND phase = '{RunPhase.RUNNING}'
  AND NOT cancel_requested
ORDER BY created_at, id
LIMIT %s
"""

QUEUED_NAMESPACES_QUERY = (
    f"SELECT DISTINCT namespace FROM flowforge_run WHERE phase = '{RunPhase.QUEUED}' "
    "ORDER BY namespace"
)

READY_RUNS_QUERY = f"""
SELECT run.id FROM flowforge_run AS run
WHERE run.namespace = %(namespace)s AND run.phase = '{RunPhase.RUNNING}'
  AND NOT run.cancel_requested AND run.id <> %(skip)s
  AND EXISTS (SELECT 1 FROM flowforge_task AS task WHERE task.run_id = run.id
              AND task.role = 'forward' AND task.state = '{TaskState.READY}'
              AND task.not_before <= now())
ORDER BY run.priority DESC, run.submitted_at, run.id
LIMIT {FILL_WINDOW}
"""

UPSERT_LIMITS_QUERY = """
INSERT INTO flowforge_namespace_limits AS limits
    (namespace, max_running_runs, max_running_tasks, max_parallel_tasks)
VALUES (%(namespace)s, %(runs)s, %(tasks)s, %(parallel)s)
ON CONFLICT (namespace) DO UPDATE
SET max_running_runs = excluded.max_running_runs,
    max_running_tasks = excluded.max_running_tasks,
    max_parallel_tasks = excluded.max_parallel_tasks, updated_at = now()
WHERE (limits.max_running_runs, limits.max_running_tasks, limits.max_parallel_tasks)
      IS DISTINCT FROM (excluded.max_running_runs, excluded.max_running_tasks,
                        excluded.max_parallel_tasks)
RETURNING namespace
"""

POSITION_QUERY = f"""
SELECT run.queue_reason, run.max_runs,
       (SELECT count(*) FROM flowforge_run AS ahead
        WHERE ahead.namespace = run.namespace AND ahead.phase = '{RunPhase.QUEUED}'
          AND (ahead.priority, run.submitted_at, run.id)
              > (run.priority, ahead.submitted_at, ahead.id)),
       (SELECT count(*) FROM flowforge_run AS queued
        WHERE queued.namespace = run.namespace AND queued.phase = '{RunPhase.QUEUED}'),
       (SELECT max_running_runs FROM flowforge_namespace_limits
        WHERE namespace = run.namespace)
FROM flowforge_run AS run WHERE run.id = %s AND run.phase = '{RunPhase.QUEUED}'
"""


async def lock_namespace(connection: Connection, namespace: str) -> None:
    await connection.execute(LOCK_NAMESPACE_QUERY, (_LOCK_PREFIX + namespace,))


async def lock_namespace_of_run(connection: Connection, run_id: int) -> str | None:
    """Take the lock of the run's namespace (its first lock in the transaction); the
    namespace, None when the run does not exist."""
    cursor = await connection.execute(LOCK_NAMESPACE_OF_RUN_QUERY, (_LOCK_PREFIX, run_id))
    row = await cursor.fetchone()
    return None if row is None else str(row[0])


async def namespace_limits_locked(connection: Connection, namespace: str) -> NamespaceLimits:
    cursor = await connection.execute(LIMITS_QUERY, (namespace,))
    row = await cursor.fetchone()
    if row is None:
        return NamespaceLimits()
    return NamespaceLimits(
        max_running_runs=row[0], max_running_tasks=row[1], max_parallel_tasks=row[2]
    )


async def dispatch_locked(connection: Connection, *, fence: Fence, run_id: int) -> Decision:
    """Inside a transaction that holds the namespace's lock: move the run's due ready tasks
    to running, as many as its limits leave room for (locks the run row)."""
    started = await read_rows(
        connection, Attempt, DISPATCH_QUERY, {"run": run_id, "epoch": fence.epoch}
    )
    dispatched = tuple(Dispatch.of(attempt) for attempt in started)
    later = await connection.execute(NEXT_DUE_QUERY, (run_id,))
    next_row = await later.fetchone()
    wake_in = None if next_row is None else next_row[0]
    return Decision(
        recorded=bool(dispatched) or wake_in is not None, create_jobs=dispatched, wake_in=wake_in
    )


@dataclasses.dataclass(frozen=True)
class Admission:
    """What one pass over a namespace's queue decided."""

    admitted: tuple[int, ...] = ()
    # queued runs whose reason changed (their status says so at once)
    requeued: tuple[int, ...] = ()
    # the other held runs, when their places moved (a run left or joined the queue)
    moved: tuple[int, ...] = ()
    # (running run to cancel, the queued Replace run's name it is cancelled for)
    replace: tuple[tuple[int, str], ...] = ()


class SettleLocked(Protocol):
    """``settle.settle_locked``, passed in: a run a Replace cancelled settles in the same
    transaction (``settle`` imports this module)."""

    async def __call__(self, connection: Connection, *, fence: Fence, run_id: int) -> Decision: ...


async def admit_locked(
    connection: Connection,
    *,
    fence: Fence,
    namespace: str,
    only: int | None = None,
    replace: bool = False,
    changed: bool = False,
) -> Admission:
    """Inside a transaction that holds the namespace's lock: let the queued runs that the
    limits allow leave the queue, in priority then creation order (``only``: admit no other
    run than that one); the others keep the reason that holds them. With ``replace``, a
    queued Replace run whose key is full names the oldest running runs to cancel for it.
    ``changed``: the caller changed the queue (a run joined or left it), so every held run's
    place is to be re-projected, as it is when this pass admits one."""
    queued = await (await connection.execute(QUEUED_QUERY, (namespace,))).fetchall()
    if not queued:
        return Admission()
    limits = await namespace_limits_locked(connection, namespace)
    if limits.max_running_runs is None and all(row[2] is None for row in queued):
        counts = []  # nothing limits these runs: no need to count what runs
    else:
        counts = await (await connection.execute(RUNNING_KEYS_QUERY, (namespace,))).fetchall()
    running = Counter({key: int(n) for key, n, _ in counts})
    cancelling = Counter({key: int(c) for key, _, c in counts})
    claimed: Counter[str | None] = Counter()  # slots of a key that held Replace runs wait for
    total = sum(running.values())
    admitted: list[int] = []
    waited: list[int] = []
    held: list[tuple[int, QueueReason, str | None]] = []
    victims: list[tuple[int, str]] = []
    for run_id, name, key, max_runs, policy, reason in queued:
        if limits.max_running_runs is not None and total >= limits.max_running_runs:
            held.append((run_id, QueueReason.NAMESPACE_RUN_LIMIT, reason))
            continue
        if key is not None and running[key] >= max_runs:
            why = QueueReason.WORKFLOW_CONCURRENCY
            if policy == ConcurrencyPolicy.REPLACE:
                why = QueueReason.REPLACING
                excess = running[key] + claimed[key] - cancelling[key] - max_runs + 1
                claimed[key] += 1
                if replace and excess > 0:
                    rows = await connection.execute(OLDEST_RUNNING_QUERY, (namespace, key, excess))
                    found = [int(victim) for (victim,) in await rows.fetchall()]
                    victims.extend((victim, str(name)) for victim in found)
                    cancelling[key] += len(found)
            held.append((run_id, why, reason))
            continue
        total += 1
        running[key] += 1
        if only is None or run_id == only:
            # (with ``only``, a run ahead that may start keeps its slot for the full pass
            # that follows: nobody overtakes it)
            admitted.append(int(run_id))
            if reason is not None:  # it waited: its history says when it left the queue
                waited.append(int(run_id))
    await _record_admission(connection, fence=fence, admitted=admitted, waited=waited, held=held)
    moved = changed or bool(admitted)
    return Admission(
        admitted=tuple(admitted),
        requeued=tuple(int(run_id) for run_id, why, before in held if why != before),
        moved=tuple(int(run_id) for run_id, why, before in held if moved and why == before),
        replace=tuple(victims),
    )


async def _record_admission(
    connection: Connection,
    *,
    fence: Fence,
    admitted: list[int],
    waited: list[int],
    held: list[tuple[int, QueueReason, str | None]],
) -> None:
    if admitted:
        await connection.execute(
            f"UPDATE flowforge_run SET phase = '{RunPhase.RUNNING}', queue_reason = NULL, "
            "updated_at = now() WHERE id = ANY(%s)",
            (admitted,),
        )
    if waited:
        await connection.execute(
            "INSERT INTO flowforge_event (run_id, namespace, kind, epoch) "
            "SELECT run_id, (SELECT namespace FROM flowforge_run WHERE id = run_id), %s, %s "
            "FROM unnest(%s::bigint[]) AS run_id",
            (EventKind.RUN_ADMITTED, fence.epoch, waited),
        )
    changed = [(run_id, why) for run_id, why, before in held if before != why]
    for run_id, why in changed:
        await connection.execute(
            "UPDATE flowforge_run SET queue_reason = %s, updated_at = now() WHERE id = %s",
            (why, run_id),
        )
        await append_event(
            connection,
            run_id=run_id,
            kind=EventKind.RUN_QUEUED,
            epoch=fence.epoch,
            detail={"reason": why.value},
        )


async def start_admitted(
    connection: Connection, *, fence: Fence, admission: Admission, skip: int | None = None
) -> tuple[RunDecision, ...]:
    """The decisions of a pass over the queue: the admitted runs' first tasks dispatched,
    and the queued runs whose reason or place changed re-projected."""
    started = []
    for run_id in admission.admitted:
        if run_id == skip:
            continue
        decision = await dispatch_locked(connection, fence=fence, run_id=run_id)
        started.append(
            RunDecision(
                run_id=run_id,
                decision=dataclasses.replace(
                    decision, recorded=True, notices=(notices.run_admitted(),)
                ),
            )
        )
    return (
        *started,
        *(
            RunDecision(run_id=run_id, decision=Decision(recorded=True))
            for run_id in admission.requeued
            if run_id != skip
        ),
        *(
            RunDecision(run_id=run_id, decision=Decision(recorded=True, queue_moved=True))
            for run_id in admission.moved
            if run_id != skip
        ),
    )


async def fill_locked(
    connection: Connection, *, fence: Fence, namespace: str, skip: int
) -> tuple[RunDecision, ...]:
    """A task slot of the namespace freed: other runs' ready tasks take it, by priority
    then age (only a namespace with ``maxRunningTasks`` shares its slots across runs)."""
    limits = await namespace_limits_locked(connection, namespace)
    if limits.max_running_tasks is None:
        return ()
    cursor = await connection.execute(READY_RUNS_QUERY, {"namespace": namespace, "skip": skip})
    filled: list[RunDecision] = []
    for (run_id,) in await cursor.fetchall():
        decision = await dispatch_locked(connection, fence=fence, run_id=int(run_id))
        if not decision.create_jobs:
            break  # the namespace is full again
        filled.append(RunDecision(run_id=int(run_id), decision=decision))
    return tuple(filled)


async def serve_locked(
    connection: Connection,
    *,
    fence: Fence,
    namespace: str,
    settle: SettleLocked | None,
    changed: bool = False,
    skip: int | None = None,
) -> tuple[Admission, tuple[RunDecision, ...]]:
    """Inside a transaction that holds the namespace's lock: one pass over its queue. The
    runs that may start do (their first tasks dispatched; ``skip``'s left to the caller),
    a queued Replace run whose key is full cancels the oldest running runs of it (with
    ``settle``; they roll back, and the last one's finish starts it), and the held runs
    whose reason or place changed are re-projected."""
    duplicates = await finish_waiting_duplicates_locked(
        connection, fence=fence, namespace=namespace
    )
    admission = await admit_locked(
        connection, fence=fence, namespace=namespace, replace=settle is not None, changed=changed
    )
    replaced = []
    if settle is not None:
        # every victim's cancel is recorded before any settles: a victim that finishes at
        # once hands its slot on in a pass of its own, which must not pick another victim
        stopped = [
            (victim, await replace_locked(connection, fence=fence, run_id=victim, by=by))
            for victim, by in admission.replace
        ]
        for victim, decision in stopped:
            settled = await settle(connection, fence=fence, run_id=victim)
            replaced.append(RunDecision(run_id=victim, decision=decision.then(settled)))
    started = await start_admitted(connection, fence=fence, admission=admission, skip=skip)
    return admission, (*duplicates, *replaced, *started)


async def rebalance_locked(
    connection: Connection,
    *,
    fence: Fence,
    namespace: str,
    skip: int,
    settle: SettleLocked | None = None,
    changed: bool = False,
) -> tuple[RunDecision, ...]:
    """After run ``skip`` freed a slot (it finished; ``changed``: it left the queue): queued
    runs that may start now do, and other runs' ready tasks take freed task slots."""
    _, started = await serve_locked(
        connection, fence=fence, namespace=namespace, settle=settle, changed=changed
    )
    return started + await fill_locked(connection, fence=fence, namespace=namespace, skip=skip)


async def set_namespace_limits(
    pool: Pool, *, fence: Fence, namespace: str, limits: NamespaceLimits
) -> tuple[RunDecision, ...]:
    """Record the namespace's limits (from its FlowForgePolicy objects); when they changed,
    what may start under the new ones does, in the same transaction."""

    async def decide(connection: Connection) -> tuple[RunDecision, ...]:
        await check_fence(connection, fence)
        await lock_namespace(connection, namespace)
        cursor = await connection.execute(
            UPSERT_LIMITS_QUERY,
            {
                "namespace": namespace,
                "runs": limits.max_running_runs,
                "tasks": limits.max_running_tasks,
                "parallel": limits.max_parallel_tasks,
            },
        )
        if await cursor.fetchone() is None:
            return ()
        return await rebalance_locked(connection, fence=fence, namespace=namespace, skip=0)

    return await in_transaction(pool, decide)


@dataclasses.dataclass(frozen=True)
class QueuePosition:
    reason: QueueReason | None
    position: int
    queued: int
    limit: int | None


async def queue_position(pool: Pool, run_id: int) -> QueuePosition | None:
    """Where a queued run waits (None: it is not queued)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(POSITION_QUERY, (run_id,))
        row = await cursor.fetchone()
    if row is None:
        return None
    reason, max_runs, ahead, queued, namespace_runs = row
    why = None if reason is None else QueueReason(reason)
    limit = namespace_runs if why is QueueReason.NAMESPACE_RUN_LIMIT else max_runs
    return QueuePosition(reason=why, position=int(ahead) + 1, queued=int(queued), limit=limit)


async def queued_namespaces(pool: Pool) -> list[str]:
    """The namespaces with queued runs (the reconciler serves each queue once a pass)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(QUEUED_NAMESPACES_QUERY)
        return [str(namespace) for (namespace,) in await cursor.fetchall()]


# runs of a concurrency key running or queued (but ``%(run)s``): what Forbid counts
RUNS_OF_KEY_QUERY = (
    "SELECT count(*) FROM flowforge_run WHERE namespace = %(namespace)s "
    f"AND concurrency_key = %(key)s AND phase IN ('{RunPhase.RUNNING}', '{RunPhase.QUEUED}') "
    "AND id IS DISTINCT FROM %(run)s"
)


async def running_count(
    connection: Connection, *, namespace: str, key: str, but: int | None = None
) -> int:
    """Runs of a concurrency key running or queued now, other than ``but``: what admission's
    Forbid reads, and what the operator checks again when it creates the run."""
    cursor = await connection.execute(
        RUNS_OF_KEY_QUERY, {"namespace": namespace, "key": key, "run": but}
    )
    row = await cursor.fetchone()
    return 0 if row is None else int(row[0])
