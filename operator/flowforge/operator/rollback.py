"""The saga rollback of a run: its compensators' Jobs, strictly one at a time.

The store decides (``flowforge.store.compensation``): which compensator is next (reverse
dependency order), that only one runs, and what a finished attempt means (success, a
retry after the backoff, or a failure that halts the rollback and settles the run). This
module acts on those decisions: it creates the Job of the compensator whose turn has come
(deterministic name, role ``compensation``, AlreadyExists is success), records how the Job
ended, and starts the next one as soon as the previous one is recorded. Every step is safe
to repeat, so the reconciler calls ``advance`` for every rolling-back run after a restart.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from flowforge.domain.execution import AttemptOutcome, jitter_unit, retry_delay
from flowforge.domain.states import CompensationState, TaskRole
from flowforge.operator import metrics
from flowforge.store import engine as store
from flowforge.store.compensation import (
    abandon_rollback,
    finish_compensation,
    next_compensation,
    start_compensation,
)
from flowforge.store.errors import TransitionConflictError

if TYPE_CHECKING:
    from flowforge.kube.jobs import JobIdentity
    from flowforge.operator.engine import Engine
    from flowforge.operator.runs import RunContext


class Rollback:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # one advance per run at a time in this process; the store refuses the rest anyway
        self._locks: dict[int, asyncio.Lock] = {}

    async def advance(self, context: RunContext) -> None:
        """Start the compensator whose turn has come, if any, and create its Job."""
        engine = self._engine
        lock = self._locks.setdefault(context.run_id, asyncio.Lock())
        async with lock:
            step = await next_compensation(engine.pool, context.run_id)
            if step is None:
                return
            wait = (step.not_before - datetime.now(UTC)).total_seconds()
            if wait > 0:  # a retry waiting for its backoff
                engine.background.later(
                    wait + 0.01,
                    key=(context.run_id, "rollback"),
                    coroutine_factory=lambda: self.advance(context),
                )
                return
            try:
                with metrics.store_timer("start_compensation"):
                    await start_compensation(
                        engine.pool,
                        fence=engine.fence(),
                        run_id=context.run_id,
                        task_key=step.task_key,
                        attempt=step.attempt,
                    )
            except TransitionConflictError:
                return  # started by another path (the reconciler): it creates the Job
            task = context.definition.spec.task(step.task_key)
            await engine.jobs.create(
                context,
                store.Dispatch(
                    run_id=context.run_id,
                    task_key=step.task_key,
                    role=TaskRole.COMPENSATION,
                    attempt=step.attempt,
                    timeout_seconds=task.timeout_seconds,
                    released_at=step.not_before,
                ),
                received=None,
            )
        engine.status.mark(context.run_id)

    async def record(
        self, context: RunContext, *, identity: JobIdentity, outcome: AttemptOutcome
    ) -> None:
        """A compensator's Job ended: record it, then start the next step at once."""
        engine = self._engine
        retry_at = None
        if not outcome.succeeded:
            # ignored by the store when the attempt was the last one
            retry_at = datetime.now(UTC) + retry_delay(
                failed_attempts=identity.attempt,
                policy=engine.settings.backoff,
                unit=jitter_unit(
                    run_uid=context.uid, task_key=identity.task_key, attempt=identity.attempt
                ),
            )
        try:
            with metrics.store_timer("finish_compensation"):
                result = await finish_compensation(
                    engine.pool,
                    fence=engine.fence(),
                    run_id=context.run_id,
                    task_key=identity.task_key,
                    attempt=identity.attempt,
                    succeeded=outcome.succeeded,
                    error=None
                    if outcome.succeeded
                    else f"{outcome.reason.value}: {outcome.message}"[:1000],
                    retry_not_before=retry_at,
                )
        except TransitionConflictError:
            return  # already recorded: a replayed event or the reconciler got there first
        metrics.TASK_OUTCOMES.labels(identity.role.value, outcome.reason.value).inc()
        engine.jobs.delete_later(context, identity=identity, outcome=outcome)
        compensates = context.definition.spec.task(identity.task_key).compensate_for
        what = f"compensator {identity.task_key} (undoing {compensates}) attempt {identity.attempt}"
        if result.state is CompensationState.SUCCEEDED:
            engine.post_event(context, reason="CompensationSucceeded", message=f"{what} succeeded")
        elif result.state is CompensationState.PENDING:
            engine.post_event(
                context,
                reason="CompensationRetrying",
                warning=True,
                message=f"{what} failed, will retry: {outcome.message}",
            )
        else:
            halted = f"; not run: {', '.join(result.halted)}" if result.halted else ""
            engine.post_event(
                context,
                reason="CompensationFailed",
                warning=True,
                message=f"{what} failed, rollback halted: "
                f"{outcome.reason.value}: {outcome.message}{halted}",
            )
        engine.after_settle(context, result.settled)
        engine.status.mark(context.run_id)
        if result.settled is not None and result.settled.finished:
            self._locks.pop(context.run_id, None)
            return
        await self.advance(context)

    async def abandon(self, context: RunContext, *, reason: str) -> None:
        """The run's object is gone (its Jobs with it): skip what is left of the rollback."""
        engine = self._engine
        skipped, settled = await abandon_rollback(
            engine.pool, fence=engine.fence(), run_id=context.run_id, reason=reason
        )
        if skipped:
            engine.after_settle(context, settled)
        self._locks.pop(context.run_id, None)
