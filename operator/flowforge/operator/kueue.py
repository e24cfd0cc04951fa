"""Jobs that queue through Kueue, as the operator follows them (rules in
``flowforge.domain.kueue``): Kueue admitting a Job (unsuspending it) and evicting it
(suspending it again) are recorded on the attempt (``store/admission.py``), never as an
outcome; an attempt whose Job waits longer than its ``admissionTimeoutSeconds`` fails with
reason ``AdmissionTimeout`` and its Job is deleted. The Job watch calls ``on_job_event`` for
every change of a Kueue Job that has not finished; the reconciler calls ``check`` for each
running attempt whose Job is suspended (a missed event, or an operator restart).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.execution import AttemptOutcome, job_outcome
from flowforge.domain.kueue import JobAdmission, admission_timeout_outcome, job_admission, queueing
from flowforge.kube.jobs import JobIdentity
from flowforge.operator import metrics
from flowforge.operator.background import Background
from flowforge.operator.kubeport import KubePort
from flowforge.operator.launcher import JobLauncher, attempt_identity
from flowforge.operator.runs import RunCache, RunContext
from flowforge.store.admission import record_admission
from flowforge.store.connection import Pool
from flowforge.store.lease import Fence

logger = logging.getLogger(__name__)
_REMEMBERED = 100_000

Apply = Callable[[RunContext, Decision], Awaitable[None]]
Record = Callable[..., Awaitable[None]]


class Admissions:
    def __init__(
        self,
        *,
        pool: Pool,
        kube: KubePort,
        fence: Callable[[], Fence],
        runs: RunCache,
        launcher: JobLauncher,
        background: Background,
        apply: Apply,
        record: Record,
    ) -> None:
        self._pool = pool
        self._kube = kube
        self._fence = fence
        self._runs = runs
        self._launcher = launcher
        self._background = background
        self._apply = apply
        self._record = record
        # Job uid -> suspended, as last recorded: a Pod's status change is no store write
        self._seen: dict[str, bool] = {}

    async def on_job_event(self, job: Mapping[str, Any], identity: JobIdentity) -> None:
        """A Kueue Job that has not finished changed: record an admission or an eviction."""
        admission = job_admission(job)
        if admission is None or identity.uid is None:
            return
        if self._seen.get(identity.uid) is admission.suspended:
            return
        context = await self._runs.by_uid(namespace=identity.namespace, uid=identity.run_uid)
        if context is None or not await self._launcher.owns(context, identity, act="admission"):
            return
        await self._recorded(context, identity, admission)

    async def _recorded(
        self, context: RunContext, identity: JobIdentity, admission: JobAdmission
    ) -> None:
        ref = JobRef(identity.task_key, identity.attempt, identity.role)
        decision = await record_admission(
            self._pool,
            fence=self._fence(),
            run_id=context.run_id,
            job=ref,
            job_name=identity.name,
            admitted=not admission.suspended,
            at=admission.since,
        )
        if identity.uid is not None:
            if len(self._seen) >= _REMEMBERED:
                self._seen.clear()
            self._seen[identity.uid] = admission.suspended
        if decision.recorded:
            metrics.KUEUE_ADMISSIONS.labels("evicted" if admission.suspended else "admitted").inc()
        await self._apply(context, decision)
        if admission.suspended:
            self.schedule(context, ref, waiting_since=admission.since)
        else:  # the pending timeout counts from admission
            self._launcher.schedule_start_check(context, ref)

    def schedule(self, context: RunContext, job: JobRef, *, waiting_since: datetime | None) -> None:
        """Check the attempt's admission when its admissionTimeoutSeconds is over."""
        timeout = self._timeout(context, job)
        if timeout is None:
            return
        waited = 0.0
        if waiting_since is not None:
            waited = (datetime.now(UTC) - waiting_since).total_seconds()
        name = context.job_name(task_key=job.task_key, attempt=job.attempt, role=job.role)
        self._background.later(
            max(0.0, timeout - waited) + 0.5,
            key=(context.run_id, f"admission:{name}"),
            coroutine_factory=lambda: self.check(context, job),
        )

    def _timeout(self, context: RunContext, job: JobRef) -> int | None:
        spec = context.definition.spec
        queued = queueing(spec, spec.task(job.task_key).type)
        return None if queued is None else queued.admission_timeout_seconds

    async def check(
        self, context: RunContext, job: JobRef, *, body: Mapping[str, Any] | None = None
    ) -> None:
        """Record the admission state of the attempt's Job (``body``: the Job, when already
        read), and fail the attempt when it has waited past its admissionTimeoutSeconds.
        Nothing is read from the store unless there is something to record."""
        claim = attempt_identity(context, job)
        if body is None:
            body = await self._kube.read_job(namespace=context.namespace, name=claim.name)
        if body is None or job_outcome(body.get("status") or {}) is not None:
            return  # gone or finished: the Job watch (or the reconciler) records it
        admission = job_admission(body)
        if admission is None:
            return
        changed = self._seen.get(str(body["metadata"].get("uid"))) is not admission.suspended
        overdue = self._overdue(context, job, name=claim.name, admission=admission)
        if not changed and overdue is None:
            return
        identity = await self._launcher.own_job(context, job, body, act="admission")
        if identity is None or identity.uid is None:
            return
        if changed:
            await self._recorded(context, identity, admission)
        if overdue is not None:
            metrics.RECONCILE_FIXES.labels("admission_timeout").inc()
            await self._record(context, identity=identity, outcome=overdue)
            await self._kube.delete_job(
                namespace=context.namespace, name=identity.name, uid=identity.uid
            )

    def _overdue(
        self, context: RunContext, job: JobRef, *, name: str, admission: JobAdmission
    ) -> AttemptOutcome | None:
        """The failed outcome of an attempt suspended past its admissionTimeoutSeconds."""
        spec = context.definition.spec
        queued = queueing(spec, spec.task(job.task_key).type)
        if queued is None or queued.admission_timeout_seconds is None:
            return None
        if not admission.suspended or admission.since is None:
            return None
        return admission_timeout_outcome(
            job=name,
            queue=queued.queue_name,
            timeout_seconds=queued.admission_timeout_seconds,
            waiting_since=admission.since,
            now=datetime.now(UTC),
        )
