"""The decisions glue: store transactions decide, Kubernetes calls follow, idempotently.

Every entry point (a new run, a finished or vanished Job, a cancel, the reconciler) first
decides in one PostgreSQL transaction fenced by the lease epoch, commits, and only then acts
on Kubernetes: deterministic Job names make creating twice harmless, and deleting a Job
happens only after its outcome is committed. A Kubernetes call is never made inside a
transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from flowforge.domain.execution import (
    AttemptOutcome,
    OutcomeReason,
    job_outcome,
    lost_outcome,
)
from flowforge.domain.states import RunPhase, TaskRole
from flowforge.kube.client import KubeClient
from flowforge.kube.jobs import JobIdentity
from flowforge.operator import metrics
from flowforge.operator.background import Background, NotLeaderError
from flowforge.operator.launcher import JobLauncher
from flowforge.operator.leadership import Leadership
from flowforge.operator.rollback import Rollback
from flowforge.operator.runs import RunCache, RunContext, RunRefusedError
from flowforge.operator.settings import OperatorSettings
from flowforge.operator.status import StatusWriter
from flowforge.store import engine as store
from flowforge.store.connection import Pool
from flowforge.store.lease import Fence
from flowforge.store.settle import SettledRun

logger = logging.getLogger(__name__)
# a hand-off slower than this (the target: event received -> dependent Job created) is
# logged with where its time went
SLOW_HANDOFF_SECONDS = 0.25


class Engine:
    def __init__(
        self, *, pool: Pool, kube: KubeClient, settings: OperatorSettings, leadership: Leadership
    ) -> None:
        self.pool = pool
        self.kube = kube
        self.settings = settings
        self.leadership = leadership
        self.runs = RunCache(pool)
        self.status = StatusWriter(pool=pool, kube=kube, runs=self.runs)
        self.rollback = Rollback(self)
        self.background = Background(on_deposed=leadership.lose)
        self.jobs = JobLauncher(self)
        self._started: set[str] = set()
        self._cancelled: set[str] = set()
        self._refused: set[str] = set()

    # plumbing

    def fence(self) -> Fence:
        fence = self.leadership.fence
        if fence is None:
            raise NotLeaderError("this operator does not hold the lease")
        return fence

    async def shutdown(self) -> None:
        self.background.shutdown()
        await self.status.close()

    # entry points

    async def start_run(self, body: Mapping[str, Any]) -> None:
        """A WorkflowRun was seen: make sure its rows exist and its ready tasks have Jobs.

        Idempotent and cheap for a run already seen (every status patch of ours comes back
        as a watch event): only the first sighting dispatches, and a cancel acts once.
        """
        metadata = body["metadata"]
        uid = str(metadata["uid"])
        try:
            context, created = await self.runs.ensure(body, fence=self.fence())
        except RunRefusedError as error:
            if uid not in self._refused:
                self._refused.add(uid)
                await self._refuse(body, str(error))
            raise
        if created:
            self.background.spawn(
                self.kube.post_run_event(
                    namespace=context.namespace,
                    run_name=context.name,
                    run_uid=context.uid,
                    reason="RunStarted",
                    message=f"running {context.definition.spec.workflow} "
                    f"v{context.definition.spec.version} "
                    f"({len(context.definition.spec.forward_tasks)} tasks)",
                ),
                what="event",
            )
        if (body.get("spec") or {}).get("cancel") and uid not in self._cancelled:
            await self.cancel(context, reason="spec.cancel is true")
            self._cancelled.add(uid)
            return
        if uid not in self._started:
            await self.dispatch(context)
            self._started.add(uid)

    async def _refuse(self, body: Mapping[str, Any], message: str) -> None:
        metadata = body["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.kube.patch_run_status(
            namespace=metadata["namespace"],
            name=metadata["name"],
            status={
                "phase": RunPhase.FAILED.value,
                "message": message[:4096],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "DefinitionRefused",
                        "message": message[:4096],
                        "lastTransitionTime": now,
                    }
                ],
            },
        )
        await self.kube.post_run_event(
            namespace=metadata["namespace"],
            run_name=metadata["name"],
            run_uid=metadata["uid"],
            reason="RunRefused",
            message=message,
            warning=True,
        )

    async def run_deleted(self, body: Mapping[str, Any]) -> None:
        """The WorkflowRun is gone: its Jobs go by garbage collection; the store keeps the
        history and records the run as cancelled."""
        metadata = body["metadata"]
        context = await self.runs.by_uid(namespace=metadata["namespace"], uid=metadata["uid"])
        if context is not None:
            await self.run_gone(context)

    async def run_gone(self, context: RunContext) -> None:
        """Cancel the run and drop what is left of its rollback: with the WorkflowRun
        gone, the garbage collector removes every Job it owns, compensators' included."""
        reason = "the WorkflowRun was deleted"
        with metrics.store_timer("cancel_run"):
            await store.cancel_run(
                self.pool, fence=self.fence(), run_id=context.run_id, reason=reason
            )
        await self.rollback.abandon(context, reason=reason)

    async def dispatch(self, context: RunContext) -> None:
        with metrics.store_timer("dispatch_due"):
            dispatched = await store.dispatch_due(
                self.pool, fence=self.fence(), run_id=context.run_id
            )
        await self.jobs.create_all(context, dispatched)
        self.status.mark(context.run_id)
        await self.schedule_due(context)

    async def on_job_event(self, job: Mapping[str, Any], event_type: str | None) -> None:
        identity = JobIdentity.of(job)
        if identity is None:
            return
        received = time.perf_counter()
        outcome = await self._observed_outcome(job, identity)
        if outcome is None and event_type != "DELETED":
            return
        context = await self.runs.by_uid(namespace=identity.namespace, uid=identity.run_uid)
        if context is None:
            return
        if outcome is None:
            if await self._run_gone(context):
                # the garbage collector removes a deleted run's Jobs: not a lost attempt
                await self.run_gone(context)
                return
            outcome = lost_outcome(job=identity.name, now=datetime.now(UTC))
        await self.record(context, identity=identity, outcome=outcome, received=received)

    async def _run_gone(self, context: RunContext) -> bool:
        body = await self.kube.read_run(namespace=context.namespace, name=context.name)
        return (
            body is None
            or body["metadata"].get("uid") != context.uid
            or bool(body["metadata"].get("deletionTimestamp"))
        )

    async def _observed_outcome(
        self, job: Mapping[str, Any], identity: JobIdentity
    ) -> AttemptOutcome | None:
        status = job.get("status") or {}
        outcome = job_outcome(status)
        if outcome is None or outcome.succeeded or outcome.reason is not OutcomeReason.JOB_FAILED:
            return outcome
        container = await self.kube.job_termination(
            namespace=identity.namespace, job_name=identity.name
        )
        return job_outcome(status, container)

    async def record(
        self,
        context: RunContext,
        *,
        identity: JobIdentity,
        outcome: AttemptOutcome,
        received: float | None = None,
    ) -> None:
        if identity.role is TaskRole.COMPENSATION:
            await self.rollback.record(context, identity=identity, outcome=outcome)
            return
        stored_at = time.perf_counter()
        with metrics.store_timer("record_outcome"):
            decision = await store.record_outcome(
                self.pool,
                fence=self.fence(),
                run_id=context.run_id,
                run_uid=context.uid,
                task_key=identity.task_key,
                attempt=identity.attempt,
                outcome=outcome,
                backoff=self.settings.backoff,
            )
        if not decision.recorded:
            return
        metrics.TASK_OUTCOMES.labels(identity.role.value, outcome.reason.value).inc()
        decided_at = time.perf_counter()
        await self.jobs.create_all(context, decision.dispatched, received=received)
        if received is not None and decision.dispatched:
            done = time.perf_counter()
            if done - received > SLOW_HANDOFF_SECONDS:
                logger.info(
                    "slow hand-off after %s: %.0f ms before the store, %.0f ms in the "
                    "store, %.0f ms creating %d Jobs",
                    identity.name,
                    (stored_at - received) * 1000,
                    (decided_at - stored_at) * 1000,
                    (done - decided_at) * 1000,
                    len(decision.dispatched),
                )
        self.jobs.delete_later(context, identity=identity, outcome=outcome)
        if decision.retry_at is not None:
            await self.schedule_due(context)
        if not outcome.succeeded:
            final = "failed" if decision.final_failure else "failed, will retry"
            self.post_event(
                context,
                reason="TaskFailed" if decision.final_failure else "TaskRetrying",
                message=f"task {identity.task_key} attempt {identity.attempt} {final}: "
                f"{outcome.reason.value}: {outcome.message}"
                + (f"; skipped {', '.join(decision.skipped)}" if decision.skipped else ""),
                warning=True,
            )
        self.after_settle(context, decision.settled)
        self.status.mark(context.run_id)
        if decision.settled is not None and decision.settled.compensating:
            await self.rollback.advance(context)

    def after_settle(self, context: RunContext, settled: SettledRun | None) -> None:
        """Events for a run that started its rollback or finished."""
        if settled is None:
            return
        if settled.compensators_triggered:
            self.post_event(
                context,
                reason="RollbackStarted",
                message="undoing what succeeded, one at a time: "
                + " -> ".join(settled.compensators_triggered),
                warning=True,
            )
        if not settled.finished:
            return
        metrics.RUNS_FINISHED.labels(settled.phase.value).inc()
        self.post_event(
            context,
            reason=f"Run{settled.phase.value.capitalize()}",
            message=f"run finished: {settled.phase.value}",
            warning=settled.phase is not RunPhase.SUCCEEDED,
        )

    def post_event(
        self, context: RunContext, *, reason: str, message: str, warning: bool = False
    ) -> None:
        self.background.spawn(
            self.kube.post_run_event(
                namespace=context.namespace,
                run_name=context.name,
                run_uid=context.uid,
                reason=reason,
                message=message,
                warning=warning,
            ),
            what="event",
        )

    async def cancel(self, context: RunContext, *, reason: str) -> None:
        with metrics.store_timer("cancel_run"):
            decision = await store.cancel_run(
                self.pool, fence=self.fence(), run_id=context.run_id, reason=reason
            )
        if not decision.recorded:
            return
        await asyncio.gather(
            *(
                self.kube.delete_job(
                    namespace=context.namespace,
                    name=context.job_name(task_key=key, attempt=attempt),
                )
                for key, attempt in decision.stop_jobs
            )
        )
        self.post_event(
            context,
            reason="RunCancelling",
            message=f"{reason}: stopped {len(decision.stop_jobs)} running tasks",
        )
        self.after_settle(context, decision.settled)
        self.status.mark(context.run_id)
        # the stopped tasks' Jobs are deleted: the rollback may begin
        if decision.settled is not None and decision.settled.compensating:
            await self.rollback.advance(context)

    async def schedule_due(self, context: RunContext) -> None:
        """Wake up when the earliest delayed retry of the run is due (no polling)."""
        rows = await store.active_tasks(self.pool, context.run_id)
        waits = [row.not_before for row in rows if row.state == "ready"]
        if not waits:
            return
        delay = max(0.0, (min(waits) - datetime.now(UTC)).total_seconds())
        self.background.later(
            delay + 0.01,
            key=(context.run_id, "dispatch"),
            coroutine_factory=lambda: self.dispatch(context),
        )
