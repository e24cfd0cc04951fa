"""Jobs that queue through Kueue, as the operator follows them (rules in
``flowforge.domain.kueue``): Kueue admitting a Job (unsuspending it) and evicting it
(suspending it again) are recorded on the attempt (``store/admission.py``), never as an
outcome; an attempt whose Job waits longer than its ``admissionTimeoutSeconds`` fails with
reason ``AdmissionTimeout`` and its Job is deleted. The Job watch calls ``on_job_event`` for
every change of a Kueue Job that has not finished; the watchdog (``watchdog.py``) records a
change the watch missed and fails an attempt that waited too long.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.kueue import JobAdmission, job_admission, queueing
from flowforge.kube.jobs import JobIdentity
from flowforge.operator import metrics
from flowforge.operator.background import Background, Deferred, Purpose
from flowforge.operator.launcher import JobLauncher
from flowforge.operator.runs import RunCache, RunContext
from flowforge.store.connection import Pool
from flowforge.store.kueue_admission import record_admission
from flowforge.store.lease import Fence

logger = logging.getLogger(__name__)
_REMEMBERED = 100_000

Apply = Callable[[RunContext, Decision], Awaitable[None]]


class Admissions:
    def __init__(
        self,
        *,
        pool: Pool,
        fence: Callable[[], Fence],
        runs: RunCache,
        launcher: JobLauncher,
        background: Background,
        apply: Apply,
    ) -> None:
        self._pool = pool
        self._fence = fence
        self._runs = runs
        self._launcher = launcher
        self._background = background
        self._apply = apply
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
        await self.record_change(context, identity, admission)

    async def record_change(
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
        """Have the watchdog look when the attempt's admissionTimeoutSeconds is over."""
        timeout = self._timeout(context, job)
        if timeout is None:
            return
        waited = 0.0
        if waiting_since is not None:
            waited = (datetime.now(UTC) - waiting_since).total_seconds()
        self._background.later(
            max(0.0, timeout - waited) + 0.5, Deferred(context.run_id, Purpose.WATCH_JOB, job=job)
        )

    def _timeout(self, context: RunContext, job: JobRef) -> int | None:
        spec = context.definition.spec
        queued = queueing(spec, spec.job_type(job.task_key))
        return None if queued is None else queued.admission_timeout_seconds

    def changed(self, body: Mapping[str, Any], admission: JobAdmission) -> bool:
        """Whether the Job's admission differs from what was last recorded of it here."""
        return self._seen.get(str(body["metadata"].get("uid"))) is not admission.suspended
