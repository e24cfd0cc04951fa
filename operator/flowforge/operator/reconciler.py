"""The periodic backstop: finds and fixes what a missed watch event left behind.

Each pass (leader only): every WorkflowRun in the watched namespaces has its store run;
every running attempt has its Job (created when missing and never created; recorded as
lost when it vanished; its outcome recorded when the Job finished), compensators included;
released tasks that are due are dispatched (and a wake-up set for the rest); runs are
settled, which finishes them or starts their rollback's next compensator (after a restart,
that is where a rollback resumes); statuses are re-projected; finished Jobs whose outcome
is committed are deleted after the TTL. The store is read before Jobs are listed, so a Job
created concurrently is never mistaken for a vanished one. A listed Job counts only if it is
the run's own (``launcher.py``: same namespace, the recorded uid): a copy is never adopted,
read for an outcome, or deleted. A Job whose Pod has not started within its task type's
``pendingTimeoutSeconds`` fails its attempt with the Pod's reason. One run's repair failing is
logged and counted and the pass goes on with the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from flowforge.domain.decision import Dispatch, JobRef
from flowforge.domain.execution import job_outcome, lost_outcome
from flowforge.domain.kueue import job_admission
from flowforge.domain.states import TaskState
from flowforge.kube.jobs import LABEL_MANAGED_BY, MANAGED_BY, JobIdentity
from flowforge.operator import metrics
from flowforge.operator.background import NotLeaderError
from flowforge.operator.engine import Engine
from flowforge.operator.finalizer import observe_run
from flowforge.operator.launcher import attempt_identity, found_job
from flowforge.operator.runs import RunContext, RunRefusedError
from flowforge.store.dispatch import record_job_created
from flowforge.store.errors import StaleEpochError
from flowforge.store.queries import TaskRecord, active_tasks, recorded_jobs, runs_by_phase
from flowforge.store.runs import list_active_runs

logger = logging.getLogger(__name__)


def identity_ref(identity: JobIdentity) -> JobRef:
    return JobRef(identity.task_key, identity.attempt, identity.role)


class Reconciler:
    def __init__(self, engine: Engine, *, interval: float) -> None:
        self._engine = engine
        self._interval = interval
        self._kick = asyncio.Event()

    def kick(self) -> None:
        """Run a pass now (e.g. right after this operator became the leader)."""
        self._kick.set()

    async def run_forever(self) -> None:
        while True:
            await self._engine.leadership.wait_until_leader()
            try:
                await self.pass_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                metrics.RECONCILE_ERRORS.inc()
                logger.exception("reconcile pass failed; next pass in %.1f s", self._interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=self._interval)
            self._kick.clear()

    def _namespaces(self) -> list[str | None]:
        return list(self._engine.settings.namespaces) or [None]

    async def pass_once(self) -> None:
        engine = self._engine
        seen_uids: set[str] = set()
        for namespace in self._namespaces():
            for body in await engine.kube.list_runs(namespace=namespace):
                seen_uids.add(body["metadata"]["uid"])
                with contextlib.suppress(RunRefusedError):
                    await observe_run(engine, body)  # also finishes a deletion left stuck
        run_ids = await self._active_run_ids()
        contexts = [await engine.runs.by_id(run_id) for run_id in run_ids]
        # the store first, then the Jobs: a Job created in between is listed, never "lost"
        snapshots = {
            c.run_id: (
                await active_tasks(engine.pool, c.run_id),
                await recorded_jobs(engine.pool, c.run_id),
            )
            for c in contexts
        }
        jobs = await self._list_jobs()
        for context in contexts:
            try:
                if context.uid not in seen_uids and await self._run_deleted(context):
                    continue
                active, created = snapshots[context.run_id]
                await self._fix_run(context, active=active, created=created, jobs=jobs)
            except (asyncio.CancelledError, NotLeaderError, StaleEpochError):
                raise
            except Exception:
                metrics.RECONCILE_ERRORS.inc()
                logger.exception(
                    "repairing run %s/%s failed; the pass goes on", context.namespace, context.name
                )
        await self._clean_up_jobs(jobs)
        for phase, count in (await runs_by_phase(engine.pool)).items():
            metrics.RUNS_BY_PHASE.labels(phase).set(count)

    async def _active_run_ids(self) -> list[int]:
        ids: list[int] = []
        while True:
            page = await list_active_runs(self._engine.pool, after_id=ids[-1] if ids else 0)
            ids.extend(page)
            if len(page) < 500:
                return ids

    async def _list_jobs(self) -> dict[tuple[str, str], dict[str, Any]]:
        jobs: dict[tuple[str, str], dict[str, Any]] = {}
        for namespace in self._namespaces():
            for job in await self._engine.kube.list_jobs(
                namespace=namespace, label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}"
            ):
                metadata = job["metadata"]
                jobs[(metadata["namespace"], metadata["name"])] = job
        return jobs

    async def _run_deleted(self, context: RunContext) -> bool:
        if (
            self._engine.settings.namespaces
            and context.namespace not in self._engine.settings.namespaces
        ):
            return False
        body = await self._engine.kube.read_run(namespace=context.namespace, name=context.name)
        if body is not None and body["metadata"]["uid"] == context.uid:
            return False
        metrics.RECONCILE_FIXES.labels("run_deleted").inc()
        await self._engine.run_gone(context)
        return True

    async def _fix_run(
        self,
        context: RunContext,
        *,
        active: list[TaskRecord],
        created: dict[tuple[str, int], str | None],
        jobs: dict[tuple[str, str], dict[str, Any]],
    ) -> None:
        engine = self._engine
        now = datetime.now(UTC)
        released = False
        for row in active:
            released = released or row.state == TaskState.READY
            if row.state != TaskState.RUNNING:
                continue
            identity = attempt_identity(context, JobRef(row.task_key, row.attempt, row.role))
            name = identity.name
            key = (row.task_key, row.attempt)
            job = jobs.get((context.namespace, name))
            if job is None and key in created:
                job = await engine.kube.read_job(namespace=context.namespace, name=name)
            if job is not None and not engine.launcher.check(
                context, found_job(identity, job), act="adopt", recorded_uid=created.get(key)
            ):
                if key not in created:
                    continue  # the name is taken by a Job that is not the run's: it waits
                job = None  # the run's Job is gone, a copy has its name
            if job is None and key in created:
                metrics.RECONCILE_FIXES.labels("job_vanished").inc()
                await engine.record(
                    context, identity=identity, outcome=lost_outcome(job=name, now=now)
                )
                continue
            if job is None:
                metrics.RECONCILE_FIXES.labels("job_missing").inc()
                await engine.launcher.create(
                    context,
                    Dispatch(
                        run_id=context.run_id,
                        task_key=row.task_key,
                        role=row.role,
                        attempt=row.attempt,
                        timeout_seconds=row.timeout_seconds,
                        released_at=row.not_before,
                    ),
                )
                continue
            if key not in created:
                await record_job_created(
                    engine.pool,
                    fence=engine.fence(),
                    run_id=context.run_id,
                    task_key=row.task_key,
                    attempt=row.attempt,
                    job=name,
                    uid=str(job["metadata"]["uid"]),
                    created=False,
                )
            if job_outcome(job.get("status") or {}) is not None:
                metrics.RECONCILE_FIXES.labels("outcome_unrecorded").inc()
                await engine.on_job_event(job, "RECONCILE")
            elif job_admission(job) is not None:  # Kueue: admitted, evicted, waited too long
                await engine.admissions.check(context, identity_ref(identity), body=job)
                await engine.check_pod_start(context, identity_ref(identity), body=job)
            else:  # a Pod that has not started within the pending timeout fails it
                await engine.check_pod_start(context, identity_ref(identity), body=job)
        if released:
            await engine.dispatch(context)  # also sets the wake-up for backoffs not over
        await engine.settle(context)
        engine.status.mark(context.run_id)

    async def _clean_up_jobs(self, jobs: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Delete the runs' own Jobs whose attempt is no longer running: unfinished ones at
        once (a cancel whose deletions a crash interrupted), finished ones after the TTL. A
        Job that only carries a run's labels is never deleted."""
        ttl = self._engine.settings.job_ttl_seconds
        cutoff = datetime.now(UTC) - timedelta(seconds=max(ttl, 0))
        known: dict[str, _RunJobs | None] = {}
        for job in jobs.values():
            outcome = job_outcome(job.get("status") or {})
            if outcome is not None and (
                ttl < 0 or outcome.finished_at is None or outcome.finished_at > cutoff
            ):
                continue
            identity = JobIdentity.of(job)
            if identity is None:
                continue
            if identity.run_uid not in known:
                known[identity.run_uid] = await self._run_jobs(identity)
            run = known[identity.run_uid]
            if run is None or (identity.task_key, identity.attempt) in run.running:
                continue  # a run this store does not know is not ours to clean up
            recorded = run.recorded.get((identity.task_key, identity.attempt))
            if not self._engine.launcher.check(
                run.context, identity, act="cleanup", recorded_uid=recorded
            ):
                continue
            if outcome is None:
                metrics.RECONCILE_FIXES.labels("orphan_job_stopped").inc()
            await self._engine.kube.delete_job(
                namespace=identity.namespace, name=identity.name, uid=identity.uid
            )

    async def _run_jobs(self, identity: JobIdentity) -> _RunJobs | None:
        context = await self._engine.runs.by_uid(namespace=identity.namespace, uid=identity.run_uid)
        if context is None:
            return None
        rows = await active_tasks(self._engine.pool, context.run_id)
        return _RunJobs(
            context=context,
            running={(row.task_key, row.attempt) for row in rows if row.state == TaskState.RUNNING},
            recorded=await recorded_jobs(self._engine.pool, context.run_id),
        )


@dataclasses.dataclass(frozen=True)
class _RunJobs:
    """What the cleanup needs of one run: its running attempts and its recorded Jobs."""

    context: RunContext
    running: set[tuple[str, int]]
    recorded: dict[tuple[str, int], str | None]
