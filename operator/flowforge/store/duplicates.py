"""Duplicates: a run whose ``spec.idempotencyKey`` matches an earlier run of its namespace.

Argo CD's self-heal re-creates a deleted object it manages; for a run, that would be a second
execution. A run with a key therefore looks, in ``create_run``'s transaction and under the
namespace's lock (so two runs of one key cannot both be the original), for the latest run of
the namespace with that key that is not itself a duplicate and not pruned: the *original*.
When there is one, the new run gets no task rows and never executes:

- the original has finished: the duplicate finishes at once with the original's phase;
- it has not: the duplicate is ``Queued`` with reason ``IdempotencyKey`` (never admitted,
  ``queue.py`` skips it) until a pass over the namespace's queue (``serve_locked``, after
  every run's finish and in each reconciler pass) sees the original finished.

A retry (``spec.retryOf``) is an explicit request to execute again: it is never a duplicate,
and as the latest run of its key it is the original of later ones.
"""

from __future__ import annotations

import dataclasses

from flowforge.domain import notices
from flowforge.domain.decision import Decision, RunDecision
from flowforge.domain.history import EventKind
from flowforge.domain.queue import QueueReason
from flowforge.domain.states import TERMINAL_RUN_PHASES, RunPhase
from flowforge.store.connection import Connection
from flowforge.store.events import append_event
from flowforge.store.lease import Fence

_FINAL = ", ".join(f"'{phase}'" for phase in sorted(TERMINAL_RUN_PHASES))

ORIGINAL_QUERY = """
SELECT id, phase FROM flowforge_run
WHERE namespace = %s AND idempotency_key = %s AND duplicate_of IS NULL AND pruned_at IS NULL
ORDER BY id DESC LIMIT 1
"""

FINISH_WAITING_QUERY = f"""
UPDATE flowforge_run AS run
SET phase = original.phase, finished_at = now(), queue_reason = NULL, updated_at = now()
FROM flowforge_run AS original
WHERE run.namespace = %s AND run.phase = '{RunPhase.QUEUED}' AND run.duplicate_of = original.id
  AND original.phase IN ({_FINAL})
RETURNING run.id, run.phase, original.id
"""


@dataclasses.dataclass(frozen=True)
class Original:
    """The earlier run of a key whose result a new run of the key shows."""

    run_id: int
    phase: RunPhase

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_RUN_PHASES


async def original_locked(connection: Connection, *, namespace: str, key: str) -> Original | None:
    """Inside a transaction that holds the namespace's lock: the run of the namespace whose
    result a new run with ``key`` shows, or None (the new run executes)."""
    cursor = await connection.execute(ORIGINAL_QUERY, (namespace, key))
    row = await cursor.fetchone()
    return None if row is None else Original(run_id=int(row[0]), phase=RunPhase(row[1]))


async def mark_duplicate_locked(
    connection: Connection, *, fence: Fence, run_id: int, original: Original
) -> None:
    """The new run ``run_id`` (just inserted ``Queued``, with no task rows) is ``original``'s
    duplicate: finished with its phase, or queued until it has one."""
    if original.finished:
        await connection.execute(
            "UPDATE flowforge_run SET duplicate_of = %s, phase = %s, finished_at = now(), "
            "updated_at = now() WHERE id = %s",
            (original.run_id, original.phase, run_id),
        )
        await _record_finished(
            connection,
            fence=fence,
            run_id=run_id,
            phase=original.phase,
            original_id=original.run_id,
        )
        return
    await connection.execute(
        "UPDATE flowforge_run SET duplicate_of = %s, queue_reason = %s, updated_at = now() "
        "WHERE id = %s",
        (original.run_id, QueueReason.IDEMPOTENCY_KEY, run_id),
    )
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_QUEUED,
        epoch=fence.epoch,
        detail={"reason": QueueReason.IDEMPOTENCY_KEY.value, "duplicateOf": original.run_id},
    )


async def finish_waiting_duplicates_locked(
    connection: Connection, *, fence: Fence, namespace: str
) -> tuple[RunDecision, ...]:
    """Inside a transaction that holds the namespace's lock: the queued duplicates whose
    original has finished take its phase."""
    cursor = await connection.execute(FINISH_WAITING_QUERY, (namespace,))
    finished = []
    for run_id, phase, original_id in await cursor.fetchall():
        final = RunPhase(phase)
        await _record_finished(
            connection, fence=fence, run_id=int(run_id), phase=final, original_id=int(original_id)
        )
        finished.append(
            RunDecision(
                run_id=int(run_id),
                decision=Decision(
                    recorded=True, phase=final, notices=(notices.run_duplicate(final),)
                ),
            )
        )
    return tuple(finished)


async def _record_finished(
    connection: Connection, *, fence: Fence, run_id: int, phase: RunPhase, original_id: int
) -> None:
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.run_finished(phase),
        epoch=fence.epoch,
        detail={"duplicateOf": original_id},
    )
