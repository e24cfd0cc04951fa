"""Jobs of running attempts: created after the decision committed, deleted after the outcome.

A Job's name is a function of (run, task, attempt, role), so creating it twice is harmless
(AlreadyExists counts as created) and the reconciler can always tell which Job an attempt
should have. A ``task.job_created`` event follows every creation: that is how a Job that
vanished is told from one that was never created.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from flowforge.domain.execution import AttemptOutcome, OutcomeReason
from flowforge.domain.states import TaskRole
from flowforge.kube.jobs import JobIdentity, JobRequest, build_job
from flowforge.operator import metrics
from flowforge.store import engine as store

if TYPE_CHECKING:
    from flowforge.operator.engine import Engine
    from flowforge.operator.runs import RunContext


class JobLauncher:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def create_all(
        self,
        context: RunContext,
        dispatched: tuple[store.Dispatch, ...],
        *,
        received: float | None = None,
    ) -> None:
        """Create the Jobs of attempts a transaction moved to running, concurrently.
        ``received``: when the event that released them arrived (hand-off latency)."""
        if dispatched:
            await asyncio.gather(
                *(self.create(context, item, received=received) for item in dispatched)
            )

    async def create_missing(self, context: RunContext, row: store.TaskRow) -> None:
        """The reconciler found a running attempt (of a task or a compensator) whose Job
        was never created."""
        await self.create(
            context,
            store.Dispatch(
                run_id=context.run_id,
                task_key=row.key,
                role=row.role,
                attempt=row.attempt,
                timeout_seconds=row.timeout_seconds,
                released_at=row.not_before,
            ),
            received=None,
        )

    async def create(
        self, context: RunContext, item: store.Dispatch, *, received: float | None
    ) -> None:
        """Create the Job of a running attempt (idempotent) and record that it exists."""
        engine = self._engine
        task = context.definition.spec.task(item.task_key)
        template = context.definition.spec.task_types[task.type]
        request = JobRequest(
            namespace=context.namespace,
            run_name=context.name,
            run_uid=context.uid,
            task_key=item.task_key,
            attempt=item.attempt,
            role=item.role,
            template=template.model_dump(mode="json", by_alias=True, exclude_none=True),
            config=task.config,
            parameters=context.parameters,
            timeout_seconds=item.timeout_seconds,
        )
        created = await engine.kube.create_job(build_job(request))
        if received is not None:
            metrics.HANDOFF_LATENCY.observe(time.perf_counter() - received)
        if created:
            metrics.JOBS_CREATED.labels(item.role.value).inc()
        cancelled = await store.record_job_created(
            engine.pool,
            fence=engine.fence(),
            run_id=context.run_id,
            task_key=item.task_key,
            attempt=item.attempt,
            job=request.name,
            created=created,
        )
        if cancelled:
            # a cancel committed between the dispatch and this creation and found no Job
            # to stop; its outcome (cancelled) is recorded, so the Job may go
            await engine.kube.delete_job(namespace=context.namespace, name=request.name)
            return
        if created and item.role is TaskRole.COMPENSATION:
            engine.post_event(
                context,
                reason="CompensationStarted",
                message=f"compensator {item.task_key} (undoing {task.compensate_for}) "
                f"attempt {item.attempt}: Job {request.name}",
            )
        elif created:
            engine.post_event(
                context,
                reason="TaskStarted",
                message=f"task {item.task_key} attempt {item.attempt}: Job {request.name}",
            )

    def delete_later(
        self, context: RunContext, *, identity: JobIdentity, outcome: AttemptOutcome
    ) -> None:
        """Delete a finished Job whose outcome is committed, after the TTL (a lost attempt's
        Job is already gone)."""
        engine = self._engine
        if engine.settings.job_ttl_seconds < 0 or outcome.reason is OutcomeReason.LOST:
            return
        engine.background.later(
            engine.settings.job_ttl_seconds,
            key=(context.run_id, identity.name),
            coroutine_factory=lambda: engine.kube.delete_job(
                namespace=identity.namespace, name=identity.name
            ),
        )
