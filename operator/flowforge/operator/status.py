"""Writes ``WorkflowRun.status`` as a projection of the store, coalescing bursts.

``mark(run_id)`` is cheap: a burst of outcomes of one run (a 50-task fan-out finishing)
becomes one projection and one status patch shortly after. A projection equal to the last
one this process patched is not sent again: a digest of it is kept per active run (bounded,
least recently written forgotten first, dropped once the final phase is written).
``force`` patches even so, for an object seen to show something else; but not within
``final_settles_seconds`` (a reconciler's interval) of the run's final status this process
patched: the view that showed something else (a reconciler's LIST page, a watch event handled
late) is then one from before that patch, and a status someone changed since is repaired by
a later pass.

``status.observedGeneration`` (kstatus reads a status made for an older generation as still
in progress) is the ``metadata.generation`` last seen (``observe``) when it differed from the
object's; a projection without it leaves the object's own in place (a merge patch).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cachetools import LRUCache, TTLCache

from flowforge.domain.execution import BackoffPolicy, attempts_made
from flowforge.domain.kueue import queueing
from flowforge.domain.projection import STATUS_TASK_SUMMARY_LIMIT, StatusInput, project_status
from flowforge.domain.queue import queue_message
from flowforge.domain.run import (
    CompensationStep,
    DuplicateOf,
    FinallySummary,
    FinalStep,
    QueueStatus,
    TaskSummary,
)
from flowforge.domain.states import (
    TERMINAL_RUN_PHASES,
    CompensationState,
    RunPhase,
    ShownTaskState,
    TaskState,
)
from flowforge.operator import metrics
from flowforge.operator.background import Clock
from flowforge.operator.creation_delays import CreationDelays
from flowforge.operator.kubeport import KubePort
from flowforge.operator.runs import RunCache, RunContext
from flowforge.store.actions import recovery_note
from flowforge.store.connection import Pool
from flowforge.store.final_tasks import final_steps
from flowforge.store.gates import awaiting_gates
from flowforge.store.queries import (
    RollbackStep,
    forward_counts,
    latest_outcomes,
    list_forward_tasks,
    rollback_started_at,
    rollback_steps,
)
from flowforge.store.queue import queue_position
from flowforge.store.runs import RunRecord, get_run

logger = logging.getLogger(__name__)
FINAL_PHASES = frozenset(phase.value for phase in TERMINAL_RUN_PHASES)
ROLLBACK_PHASES = frozenset((RunPhase.FAILED, RunPhase.CANCELLED))
COALESCE_SECONDS = 0.1
# a queued run whose place alone moved is re-projected within this: every hand-off moves
# every place of the queue, and one patch per queued run per hand-off would load the
# apiserver (and delay the next hand-off) for a number that moves on anyway
QUEUE_MOVES_SECONDS = 10.0
# digests of the last patched projection, one per run (an active run's is ~100 bytes)
REMEMBERED_PROJECTIONS = 100_000
# projections share the store pool with outcome transactions: keep them to a few connections
CONCURRENT_PROJECTIONS = 3


class StatusWriter:
    def __init__(
        self,
        *,
        pool: Pool,
        kube: KubePort,
        runs: RunCache,
        delays: CreationDelays | None = None,
        final_settles_seconds: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: the one ``final_settles_seconds`` is measured on (monotonic, unless a
        test moves time itself)."""
        self._pool = pool
        self._delays = delays or CreationDelays(policy=BackoffPolicy())
        self._kube = kube
        self._runs = runs
        self._dirty: set[int] = set()
        # the contexts of marked runs, when the marker had one: a run that just finished is
        # no longer cached, and its last projection need not read it back
        self._contexts: dict[int, RunContext] = {}
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._moved: set[int] = set()  # queued runs whose place moved, not marked yet
        self._moves: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(CONCURRENT_PROJECTIONS)
        self._patched: LRUCache[int, bytes] = LRUCache(maxsize=REMEMBERED_PROJECTIONS)
        self._writing = 0
        # generations to show, of runs whose object showed another one (or no status)
        self._generations: LRUCache[int, int] = LRUCache(maxsize=REMEMBERED_PROJECTIONS)
        # runs whose final status this process patched moments ago
        self._finals: TTLCache[int, None] = TTLCache(
            maxsize=REMEMBERED_PROJECTIONS,
            ttl=final_settles_seconds,
            timer=time.monotonic if clock is None else clock.time,
        )

    def __len__(self) -> int:
        """How many runs' last projection is remembered."""
        return len(self._patched)

    def pending(self) -> int:
        """Runs whose status is marked or being written."""
        return len(self._dirty | self._moved) + self._writing

    def mark(
        self,
        run_id: int,
        *,
        force: bool = False,
        shown: Mapping[str, Any] | None = None,
        context: RunContext | None = None,
        queue_moved: bool = False,
    ) -> None:
        """Re-project the run's status soon. ``shown``: the status its object shows now (a
        projection equal to it is not patched, e.g. at the first sighting after a restart);
        ``context``: the run's, when the caller has it. ``queue_moved``: only its place in the
        queue moved; it is re-projected with the queue's other moves, within
        ``QUEUE_MOVES_SECONDS``."""
        if queue_moved and not force:
            self._moved.add(run_id)
            if self._moves is None or self._moves.done():
                self._moves = asyncio.get_running_loop().create_task(self._fold_moves())
            return
        self._moved.discard(run_id)
        if force and run_id in self._finals:
            return  # the object was seen before our final patch reached it
        if context is not None:
            self._contexts[run_id] = context
        if force:
            self._patched.pop(run_id, None)
        elif shown and run_id not in self._patched:
            self._patched[run_id] = _digest(shown)
        self._dirty.add(run_id)
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())

    def observe(self, run_id: int, body: Mapping[str, Any]) -> None:
        """The run's object as seen: a status made for another ``metadata.generation`` (a
        cancel, an edit of a finished run's spec) or none yet is re-projected for it."""
        generation = (body.get("metadata") or {}).get("generation")
        if not isinstance(generation, int):
            return
        if (body.get("status") or {}).get("observedGeneration") == generation:
            return
        if self._generations.get(run_id) != generation:
            self._generations[run_id] = generation
            self.mark(run_id)

    async def close(self) -> None:
        for task in (self._worker, self._moves):
            if task is not None:
                task.cancel()

    async def _fold_moves(self) -> None:
        await asyncio.sleep(QUEUE_MOVES_SECONDS)
        moved, self._moved = self._moved, set()
        for run_id in moved:
            self.mark(run_id)

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(COALESCE_SECONDS)
            self._wake.clear()
            batch, self._dirty = self._dirty, set()
            self._writing = len(batch)
            try:
                results = await asyncio.gather(
                    *(self.write(run_id) for run_id in batch), return_exceptions=True
                )
            finally:
                self._writing = 0
            for run_id, result in zip(batch, results, strict=True):
                if isinstance(result, Exception):
                    logger.warning("status of run %d not written: %s", run_id, result)

    async def project(self, context: RunContext) -> dict[str, Any]:
        record = await get_run(self._pool, context.run_id)
        spec = context.definition.spec
        counts = await forward_counts(
            self._pool,
            context.run_id,
            kueue=any(queueing(spec, name) is not None for name in spec.task_types),
        )
        summaries: list[TaskSummary] = []
        if counts.total <= STATUS_TASK_SUMMARY_LIMIT:
            rows = await list_forward_tasks(self._pool, context.run_id)
            delayed = self._delays.messages(context.run_id)
            outcomes = await latest_outcomes(
                self._pool, context.run_id, [row.task_key for row in rows]
            )
            for row in rows:
                state = TaskState(row.state)
                shown = ShownTaskState(row.shown_state)
                outcome = outcomes.get(row.task_key, {})
                made = attempts_made(
                    state=state, attempt=row.attempt, started=row.started_at is not None
                )
                summaries.append(
                    TaskSummary(
                        name=row.task_key,
                        state=shown,
                        attempt=made,
                        job_name=context.job_name(task_key=row.task_key, attempt=made)
                        if made
                        else None,
                        exit_code=outcome.get("exitCode"),
                        message=_task_message(
                            shown,
                            delayed=delayed.get((row.task_key, row.attempt), ""),
                            error=row.last_error or "",
                            reason=str(outcome.get("reason") or ""),
                        ),
                        started_at=row.started_at,
                        finished_at=row.finished_at,
                    )
                )
        # only a run that ends Failed or Cancelled is ever rolled back: no steps before
        rolled_back = record.compensating or record.phase in ROLLBACK_PHASES
        steps = await rollback_steps(self._pool, context.run_id) if rolled_back else []
        duplicate = None
        if record.duplicate_of is not None:
            original = await get_run(self._pool, record.duplicate_of)
            duplicate = DuplicateOf(name=original.name, uid=original.uid, phase=original.phase)
        failure = None
        if counts.failed:
            failed = [s.name for s in summaries if s.state is ShownTaskState.FAILED]
            failure = (
                f"task {', '.join(failed)} failed" if failed else f"{counts.failed} tasks failed"
            )
            why = [s.message for s in summaries if s.state is ShownTaskState.FAILED and s.message]
            if len(failed) == 1 and why:
                failure += f": {why[0]}"
        return project_status(
            StatusInput(
                phase=record.phase,
                counts=counts,
                fingerprint=context.definition.fingerprint,
                started_at=record.created_at,
                finished_at=record.finished_at,
                now=datetime.now(UTC),
                cancel_requested=record.cancel_requested,
                failure_message=failure,
                tasks=summaries,
                compensating=record.compensating or record.recovering,
                compensation=[_step(row) for row in steps],
                rollback_started_at=(
                    await rollback_started_at(self._pool, context.run_id) if steps else None
                ),
                rollback_halted_at=next(
                    (row.finished_at for row in steps if row.state is CompensationState.FAILED),
                    None,
                ),
                queue=await self._queue(context) if record.phase is RunPhase.QUEUED else None,
                observed_generation=self._generations.get(context.run_id),
                recovered_by=await recovery_note(self._pool, context.run_id) if steps else None,
                duplicate_of=duplicate,
                paused_at=record.paused_at,
                deferred_cancel=record.deferred_cancel,
                final=await self._final(record),
                awaiting_approval=(
                    await awaiting_gates(self._pool, context.run_id) if counts.awaiting else ()
                ),
            )
        )

    async def _final(self, record: RunRecord) -> FinallySummary | None:
        """The finally tasks, once the run's outcome is decided."""
        if record.final_phase is None:
            return None
        steps = [
            FinalStep(name=key, state=state, attempt=attempt, message=error[:1024])
            for key, state, attempt, error in await final_steps(self._pool, record.id)
        ]
        return FinallySummary(
            outcome=RunPhase(record.final_phase),
            rollback=record.rollback_outcome or "None",
            steps=steps,
        )

    async def _queue(self, context: RunContext) -> QueueStatus | None:
        where = await queue_position(self._pool, context.run_id)
        if where is None or where.reason is None:
            return None
        message = queue_message(
            where.reason, position=where.position, queued=where.queued, limit=where.limit
        )
        return QueueStatus(reason=where.reason.value, position=where.position, message=message)

    async def write(self, run_id: int) -> None:
        async with self._slots:
            context = self._contexts.pop(run_id, None) or await self._runs.by_id(run_id)
            body = await self.project(context)
        digest = _digest(body)
        if self._patched.get(run_id) == digest:
            metrics.STATUS_UNCHANGED.inc()
            return
        final = body.get("phase") in FINAL_PHASES
        if final:  # a view that shows another phase from now on is one from before this patch
            self._finals[run_id] = None
        try:
            await self._kube.patch_run_status(
                namespace=context.namespace, name=context.name, status=body
            )
        except BaseException:
            self._finals.pop(run_id, None)
            raise
        if final:
            self._patched.pop(run_id, None)  # nothing changes after this: forget the run
            self._generations.pop(run_id, None)
        else:
            self._patched[run_id] = digest


def _digest(status: Mapping[str, Any]) -> bytes:
    encoded = json.dumps(status, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(encoded, digest_size=16).digest()


def _task_message(state: ShownTaskState, *, delayed: str, error: str, reason: str) -> str:
    """A task's line in the status: why its Job is not created yet while it runs; that it
    waits for Kueue; why it failed (the outcome's reason first: ``Unschedulable: ...``)."""
    if state is ShownTaskState.RUNNING:
        return delayed[:1024]
    if state is ShownTaskState.ADMITTING:
        return (delayed or "the Job waits for Kueue's admission")[:1024]
    if state is ShownTaskState.FAILED and reason and error and not error.startswith(reason):
        return f"{reason}: {error}"[:1024]
    return error[:1024]


def _step(row: RollbackStep) -> CompensationStep:
    message = row.last_error or ""
    if row.state is CompensationState.SKIPPED and not message:
        message = "not run: the rollback halted"
    return CompensationStep(
        name=row.task_key,
        compensates=row.compensates_key,
        state=row.state,
        attempt=attempts_made(
            state=row.state, attempt=row.attempt, started=row.started_at is not None
        ),
        message=message[:1024],
    )
