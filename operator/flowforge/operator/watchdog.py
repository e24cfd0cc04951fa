"""The one watchdog of running attempts: an attempt whose Job waited too long fails.

Two timeouts, one rule ("the time is over: record the failure, then delete the Job"):

- ``admissionTimeoutSeconds`` of a task type that queues through Kueue: its Job stays
  suspended (not admitted, or evicted and not admitted again) for longer;
- ``pendingTimeoutSeconds``: no Pod of the Job has started that long after the Job was
  created (after Kueue admitted it, for a Kueue Job).

``check`` is what a deferred ``watch-job`` key (``background.py``) and the reconciler's pass
call for a running attempt's Job; it also records a Kueue admission or eviction that the
watch missed. Nothing is read from the store unless there is something to record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from flowforge.domain.decision import JobRef
from flowforge.domain.execution import (
    AttemptOutcome,
    job_outcome,
    not_started_outcome,
    parse_timestamp,
)
from flowforge.domain.kueue import JobAdmission, admission_timeout_outcome, job_admission, queueing
from flowforge.kube.jobs import JobIdentity
from flowforge.operator import metrics
from flowforge.operator.kubeport import KubePort
from flowforge.operator.kueue import Admissions
from flowforge.operator.launcher import JobLauncher, attempt_identity
from flowforge.operator.runs import RunContext
from flowforge.store.connection import Pool
from flowforge.store.queries import recorded_job_age

Record = Callable[..., Awaitable[None]]


class Watchdog:
    def __init__(
        self,
        *,
        pool: Pool,
        kube: KubePort,
        launcher: JobLauncher,
        admissions: Admissions,
        record: Record,
    ) -> None:
        self._pool = pool
        self._kube = kube
        self._launcher = launcher
        self._admissions = admissions
        self._record = record

    async def check(
        self, context: RunContext, job: JobRef, *, body: Mapping[str, Any] | None = None
    ) -> None:
        """Look at the attempt's Job (``body``: when already read) and fail the attempt if
        it waited past its admission or pending timeout."""
        claim = attempt_identity(context, job)
        if body is None:
            body = await self._kube.read_job(namespace=context.namespace, name=claim.name)
        if body is None or job_outcome(body.get("status") or {}) is not None:
            return  # gone or finished: the Job watch (or the reconciler) records it
        admission = job_admission(body)
        if admission is not None and self._admissions.changed(body, admission):
            identity = await self._launcher.own_job(context, job, body, act="admission")
            if identity is None:
                return
            await self._admissions.record_change(context, identity, admission)
        now = datetime.now(UTC)
        if admission is not None and admission.suspended:
            overdue = self._admission_overdue(context, job, name=claim.name, admission=admission)
            if overdue is not None:
                await self._fail(context, job, body, overdue, kind="admission_timeout")
            return
        await self._check_started(context, job, body, admission=admission, now=now)

    def _admission_overdue(
        self, context: RunContext, job: JobRef, *, name: str, admission: JobAdmission
    ) -> AttemptOutcome | None:
        spec = context.definition.spec
        queued = queueing(spec, spec.job_type(job.task_key))
        if queued is None or queued.admission_timeout_seconds is None or admission.since is None:
            return None
        return admission_timeout_outcome(
            job=name,
            queue=queued.queue_name,
            timeout_seconds=queued.admission_timeout_seconds,
            waiting_since=admission.since,
            now=datetime.now(UTC),
        )

    async def _check_started(
        self,
        context: RunContext,
        job: JobRef,
        body: Mapping[str, Any],
        *,
        admission: JobAdmission | None,
        now: datetime,
    ) -> None:
        status = body.get("status") or {}
        if status.get("ready") or status.get("succeeded") or status.get("failed"):
            return  # a Pod is running, or has run
        timeout = self._launcher.pending_timeout(context, job.task_key)
        created = parse_timestamp(body["metadata"].get("creationTimestamp"))
        if admission is not None:  # a Kueue Job: the time counts from its admission
            created = admission.since or created
        if created is None or (now - created).total_seconds() < timeout:
            return
        identity = await self._launcher.own_job(context, job, body, act="outcome")
        if identity is None or identity.uid is None:
            return
        if admission is None:
            # a creationTimestamp has whole seconds (the Job may be up to 1 s younger than
            # it says); the store recorded the creation exactly, after it happened
            age = await recorded_job_age(
                self._pool,
                run_id=context.run_id,
                task_key=job.task_key,
                attempt=job.attempt,
                uid=identity.uid,
            )
            if age is not None and age < timeout:
                return  # the timer, or the reconciler's next pass, looks again
        pods = await self._kube.job_pods(
            namespace=context.namespace, job_name=identity.name, job_uid=identity.uid
        )
        outcome = not_started_outcome(pods, job=identity.name, timeout_seconds=timeout, now=now)
        if outcome is not None:
            await self._fail(context, job, body, outcome, kind="pod_not_started", known=identity)

    async def _fail(
        self,
        context: RunContext,
        job: JobRef,
        body: Mapping[str, Any],
        outcome: AttemptOutcome,
        *,
        kind: str,
        known: JobIdentity | None = None,
    ) -> None:
        """The time is over: record the attempt's failure, then delete its Job (the run's
        own only: the recorded uid)."""
        identity = known or await self._launcher.own_job(context, job, body, act="outcome")
        if identity is None or identity.uid is None:
            return
        metrics.RECONCILE_FIXES.labels(kind).inc()
        await self._record(context, identity=identity, outcome=outcome)
        await self._kube.delete_job(
            namespace=context.namespace, name=identity.name, uid=identity.uid
        )
