"""Jobs of running attempts: created after the decision that dispatched them committed.

A Job's name is a function of (run, task, attempt, role), so creating it twice is harmless
(AlreadyExists counts as created) and the reconciler can always tell which Job an attempt
should have. A ``task.job_created`` event follows every creation: that is how a Job that
vanished is told from one that was never created.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from flowforge.domain import notices
from flowforge.domain.decision import Dispatch
from flowforge.domain.states import TaskRole
from flowforge.kube.jobs import JobRequest, build_job
from flowforge.operator import metrics
from flowforge.operator.kubeport import KubePort
from flowforge.operator.notifier import Notifier
from flowforge.operator.runs import RunContext
from flowforge.store.connection import Pool
from flowforge.store.dispatch import record_job_created
from flowforge.store.lease import Fence


class JobLauncher:
    def __init__(
        self, *, kube: KubePort, pool: Pool, fence: Callable[[], Fence], notifier: Notifier
    ) -> None:
        self._kube = kube
        self._pool = pool
        self._fence = fence
        self._notifier = notifier

    async def create_all(
        self, context: RunContext, dispatched: tuple[Dispatch, ...], *, received: float | None
    ) -> None:
        """Create the Jobs of attempts a transaction moved to running, concurrently.
        ``received``: when the event that released them arrived (hand-off latency)."""
        if dispatched:
            await asyncio.gather(
                *(self.create(context, item, received=received) for item in dispatched)
            )

    async def create(
        self, context: RunContext, item: Dispatch, *, received: float | None = None
    ) -> None:
        """Create the Job of a running attempt (idempotent) and record that it exists."""
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
        created = await self._kube.create_job(build_job(request))
        if received is not None:
            metrics.HANDOFF_LATENCY.observe(time.perf_counter() - received)
        if created:
            metrics.JOBS_CREATED.labels(item.role.value).inc()
        cancelled = await record_job_created(
            self._pool,
            fence=self._fence(),
            run_id=context.run_id,
            task_key=item.task_key,
            attempt=item.attempt,
            job=request.name,
            created=created,
        )
        if cancelled:
            # a cancel committed between the dispatch and this creation and found no Job
            # to stop; its outcome (cancelled) is recorded, so the Job may go
            await self._kube.delete_job(namespace=context.namespace, name=request.name)
            return
        if not created:
            return
        if item.role is TaskRole.COMPENSATION:
            notice = notices.compensation_started(
                task_key=item.task_key,
                compensates=str(task.compensate_for),
                attempt=item.attempt,
                job=request.name,
            )
        else:
            notice = notices.task_started(
                task_key=item.task_key, attempt=item.attempt, job=request.name
            )
        self._notifier.post(context, notice)
