"""The periodic backstop: finds and fixes what a missed watch event left behind.

Each pass (leader only): every WorkflowRun in the watched namespaces has its store run;
every running attempt has its Job (created when missing and never created; recorded as
lost when it vanished; its outcome recorded when the Job finished), compensators included;
released tasks that are due are dispatched; runs are settled; statuses are re-projected;
finished Jobs whose outcome is committed are deleted after the TTL; and, once the Jobs of
stopped tasks are gone, a rollback whose next compensator has no Job yet is advanced (after
a restart, that is where the rollback resumes). The store is read before Jobs are listed,
so a Job created concurrently is never mistaken for a vanished one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from flowforge.domain.execution import job_outcome, lost_outcome
from flowforge.domain.states import CompensationState, TaskRole, TaskState
from flowforge.kube.jobs import LABEL_MANAGED_BY, MANAGED_BY, JobIdentity
from flowforge.operator import metrics
from flowforge.operator.engine import Engine
from flowforge.operator.runs import RunContext, RunRefusedError
from flowforge.store import engine as store
from flowforge.store.runs import list_active_runs
from flowforge.store.settle import settle_run

logger = logging.getLogger(__name__)


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
                    await engine.start_run(body)
        run_ids = await self._active_run_ids()
        contexts = [await engine.runs.by_id(run_id) for run_id in run_ids]
        # the store first, then the Jobs: a Job created in between is listed, never "lost"
        snapshots = {
            c.run_id: (
                await store.active_tasks(engine.pool, c.run_id),
                await store.job_created_attempts(engine.pool, c.run_id),
            )
            for c in contexts
        }
        jobs = await self._list_jobs()
        rolling_back: list[RunContext] = []
        for context in contexts:
            if context.uid not in seen_uids and await self._run_deleted(context):
                continue
            active, created = snapshots[context.run_id]
            if await self._fix_run(context, active=active, created=created, jobs=jobs):
                rolling_back.append(context)
        await self._clean_up_jobs(jobs)
        for context in rolling_back:
            await engine.rollback.advance(context)
        for phase, count in (await store.runs_by_phase(engine.pool)).items():
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
        active: list[store.TaskRow],
        created: set[tuple[str, int]],
        jobs: dict[tuple[str, str], dict[str, Any]],
    ) -> bool:
        """Fix one run; True when its rollback has a compensator waiting for its turn."""
        engine = self._engine
        now = datetime.now(UTC)
        due = waiting_for_backoff = False
        rollback_pending = False
        for row in active:
            if row.role is TaskRole.COMPENSATION and row.state == CompensationState.PENDING:
                rollback_pending = True
                continue
            if row.state == TaskState.READY:
                due = due or row.not_before <= now
                waiting_for_backoff = waiting_for_backoff or row.not_before > now
                continue
            if row.state != TaskState.RUNNING:
                continue
            name = context.job_name(task_key=row.key, attempt=row.attempt, role=row.role)
            identity = JobIdentity(
                namespace=context.namespace,
                name=name,
                run_uid=context.uid,
                task_key=row.key,
                attempt=row.attempt,
                role=row.role,
            )
            job = jobs.get((context.namespace, name))
            if job is None and (row.key, row.attempt) in created:
                job = await engine.kube.read_job(namespace=context.namespace, name=name)
                if job is None:
                    metrics.RECONCILE_FIXES.labels("job_vanished").inc()
                    await engine.record(
                        context, identity=identity, outcome=lost_outcome(job=name, now=now)
                    )
                    continue
            if job is None:
                metrics.RECONCILE_FIXES.labels("job_missing").inc()
                await engine.jobs.create_missing(context, row)
                continue
            if (row.key, row.attempt) not in created:
                await store.record_job_created(
                    engine.pool,
                    fence=engine.fence(),
                    run_id=context.run_id,
                    task_key=row.key,
                    attempt=row.attempt,
                    job=name,
                    created=False,
                )
            if job_outcome(job.get("status") or {}) is not None:
                metrics.RECONCILE_FIXES.labels("outcome_unrecorded").inc()
                await engine.on_job_event(job, "RECONCILE")
        if due:
            await engine.dispatch(context)
        elif waiting_for_backoff:
            await engine.schedule_due(context)  # e.g. after a restart: no timer in memory
        settled = await settle_run(engine.pool, fence=engine.fence(), run_id=context.run_id)
        engine.after_settle(context, settled)
        engine.status.mark(context.run_id)
        return rollback_pending or (settled is not None and settled.compensating)

    async def _clean_up_jobs(self, jobs: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Delete Jobs whose attempt is no longer running: unfinished ones at once (a cancel
        whose deletions a crash interrupted), finished ones after the TTL."""
        ttl = self._engine.settings.job_ttl_seconds
        cutoff = datetime.now(UTC) - timedelta(seconds=max(ttl, 0))
        running: dict[str, set[tuple[str, int]] | None] = {}
        for job in jobs.values():
            outcome = job_outcome(job.get("status") or {})
            if outcome is not None and (
                ttl < 0 or outcome.finished_at is None or outcome.finished_at > cutoff
            ):
                continue
            identity = JobIdentity.of(job)
            if identity is None:
                continue
            if identity.run_uid not in running:
                running[identity.run_uid] = await self._running_attempts(identity)
            attempts = running[identity.run_uid]
            if attempts is None or (identity.task_key, identity.attempt) in attempts:
                continue  # a run this store does not know is not ours to clean up
            if outcome is None:
                metrics.RECONCILE_FIXES.labels("orphan_job_stopped").inc()
            await self._engine.kube.delete_job(namespace=identity.namespace, name=identity.name)

    async def _running_attempts(self, identity: JobIdentity) -> set[tuple[str, int]] | None:
        context = await self._engine.runs.by_uid(namespace=identity.namespace, uid=identity.run_uid)
        if context is None:
            return None
        rows = await store.active_tasks(self._engine.pool, context.run_id)
        return {(row.key, row.attempt) for row in rows if row.state == TaskState.RUNNING}
