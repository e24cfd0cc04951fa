"""The run engine's entry points: what happened -> one store move -> its decision applied.

Every entry point (a WorkflowRun seen, a Job finished or vanished, a cancel, a wake-up,
the reconciler) first decides in one PostgreSQL transaction fenced by the lease epoch
(``flowforge.store``), commits, and only then hands the ``Decision`` to the applier
(``applier.py``), which acts on Kubernetes idempotently. A Kubernetes call is never made
inside a transaction, and a lost race is a decision like any other (it changes nothing).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cachetools import LRUCache

from flowforge.domain import notices
from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.execution import (
    AttemptOutcome,
    OutcomeReason,
    job_outcome,
    lost_outcome,
)
from flowforge.domain.observed_job import JobMeaning, job_meaning
from flowforge.domain.observed_pod import (
    PodIgnored,
    RecordedJob,
    files_forged,
    forged_files_outcome,
    job_claim,
    pod_outcome,
    pod_verdict,
    task_container_success,
    tracked,
)
from flowforge.domain.projection import refused_status
from flowforge.domain.queue import namespace_limits
from flowforge.domain.run import refused_for_good, run_gone, shown_phase
from flowforge.domain.states import RunPhase
from flowforge.kube.events import RunEvent
from flowforge.kube.jobs import JobIdentity
from flowforge.operator import metrics, tracing
from flowforge.operator.applier import Applier
from flowforge.operator.background import Background, Clock, Deferred, Purpose
from flowforge.operator.creation_delays import CreationDelays
from flowforge.operator.creation_turns import CreationTurns
from flowforge.operator.failures import Failures
from flowforge.operator.kubeport import KubePort
from flowforge.operator.kueue import Admissions
from flowforge.operator.launcher import AttemptHooks, JobLauncher, attempt_identity
from flowforge.operator.leadership import Leadership
from flowforge.operator.notifier import Notifier
from flowforge.operator.runs import NamespaceUids, RunCache, RunContext, RunRefusedError
from flowforge.operator.settings import OperatorSettings
from flowforge.operator.status import StatusWriter
from flowforge.operator.watchdog import Watchdog
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.dispatch import dispatch_due
from flowforge.store.lease import Fence
from flowforge.store.moves import settle_run
from flowforge.store.outcomes import record_outcome
from flowforge.store.queue import set_namespace_limits

logger = logging.getLogger(__name__)
# a hand-off slower than this (the target: event received -> dependent Job created) is
# logged with where its time went
SLOW_HANDOFF_SECONDS = 0.25
# Jobs (by uid) whose attempt's outcome is in the store: their later watch events (the Job's
# own success after its Pod's, a deadline the Pod beat, the TTL's deletion) and their Pods'
# need no store read; and Pods (by uid) seen with the Job controller's tracking finalizer
REMEMBERED_OUTCOMES = 10_000


class Engine:
    def __init__(
        self,
        *,
        pool: Pool,
        kube: KubePort,
        settings: OperatorSettings,
        leadership: Leadership,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: when deferred work is due and a final status has settled (the event
        loop's, unless a test moves time itself)."""
        self.pool = pool
        self.kube = kube
        self.settings = settings
        self.leadership = leadership
        self.namespaces = NamespaceUids(kube.namespace_uid)
        self.runs = RunCache(pool, namespace_uid=self.namespaces.uid)
        self.failures = Failures(on_deposed=leadership.lose)
        self.background = Background(failures=self.failures, fire=self.on_deferred, clock=clock)
        self.delays = CreationDelays(policy=settings.job_creation_retry)
        # a view of a run older than its final status patch comes at most a pass later
        settles = settings.reconcile_interval_seconds
        self.status = StatusWriter(
            pool=pool,
            kube=kube,
            runs=self.runs,
            delays=self.delays,
            final_settles_seconds=settles,
            clock=clock,
        )
        self.notifier = Notifier(kube=kube, background=self.background)
        self.launcher = JobLauncher(
            kube=kube,
            pool=pool,
            fence=self.leadership.require_fence,
            notifier=self.notifier,
            background=self.background,
            hooks=AttemptHooks(
                fail=self.fail_attempt,
                delays=self.delays,
                default_pending_timeout=settings.pending_timeout_seconds,
                mark=self.status.mark,
                check_admission=lambda context, job: self.admissions.schedule(
                    context, job, waiting_since=None
                ),
            ),
            turns=CreationTurns(
                rate=settings.job_creation_qps, burst=settings.job_creation_burst, clock=clock
            ),
        )
        self.applier = Applier(
            kube=kube,
            launcher=self.launcher,
            notifier=self.notifier,
            status=self.status,
            background=self.background,
            job_ttl_seconds=lambda: self.settings.job_ttl_seconds,
            runs=self.runs,
        )
        self.admissions = Admissions(
            pool=pool,
            fence=self.leadership.require_fence,
            runs=self.runs,
            launcher=self.launcher,
            background=self.background,
            apply=self.applier.apply,
        )
        self.watchdog = Watchdog(
            pool=pool,
            kube=kube,
            launcher=self.launcher,
            admissions=self.admissions,
            record=self.record,
        )
        self._refused: set[str] = set()
        self._limits_read: set[str] = set()  # namespaces whose limits this process copied
        self._recorded_jobs: LRUCache[str, None] = LRUCache(maxsize=REMEMBERED_OUTCOMES)
        self._tracked_pods: LRUCache[str, None] = LRUCache(maxsize=REMEMBERED_OUTCOMES)

    def fence(self) -> Fence:
        return self.leadership.require_fence()

    async def shutdown(self) -> None:
        self.background.shutdown()
        await self.status.close()

    async def start_run(self, body: Mapping[str, Any]) -> None:
        """A WorkflowRun was seen: make sure its rows exist and its ready tasks have Jobs.

        Idempotent and cheap for a run already seen (every status patch of ours comes back
        as a watch event): only the first sighting dispatches, and a cancel acts once.
        """
        uid = str(body["metadata"]["uid"])
        tracing.saw_run(body)
        finished = self.runs.final(uid)
        if finished is not None:  # a final phase never changes: nothing to read
            self.status.observe(finished[0], body)
            self._show_final(body, run_id=finished[0], phase=finished[1])
            return
        namespace = str(body["metadata"]["namespace"])
        if namespace not in self._limits_read:
            await self.policy_changed(namespace)  # the limits hold from the first run on
        try:
            sighting = await self.runs.ensure(body, fence=self.fence())
        except RunRefusedError as error:
            if uid not in self._refused and not refused_for_good(body):
                self._refused.add(uid)
                await self._refuse(body, str(error), reason=error.reason)
            raise
        context = sighting.context
        self.status.observe(context.run_id, body)
        if sighting.phase is not None and sighting.finished:
            # nothing to start or cancel, and only its final phase is kept
            self.runs.finished(run_id=context.run_id, uid=uid, phase=sighting.phase)
            self._show_final(body, run_id=context.run_id, phase=sighting.phase)
            return
        if sighting.created:
            self._announce(context, running=sighting.phase is RunPhase.RUNNING)
        if (body.get("spec") or {}).get("cancel") and uid not in self.runs.cancelled:
            await self.cancel(context, reason="spec.cancel is true")
            if context.run_id in self.runs:  # still going (its rollback): remember the cancel
                self.runs.cancelled.add(uid)
            return
        if uid not in self.runs.started:
            await self.dispatch(context)
            # the first sighting in this process (e.g. after a restart) re-projects the
            # status even when nothing was dispatched: a run that finished while no
            # operator was there to patch its object would otherwise show Running
            self.status.mark(context.run_id, shown=body.get("status"))
            if context.run_id in self.runs:
                self.runs.started.add(uid)

    def _announce(self, context: RunContext, *, running: bool) -> None:
        """The run's RunStarted Event; a single-task run that runs at once (not queued, not
        a duplicate) has its task's Job created by the dispatch that follows: the Event tells
        that start too, one Event where there were two, with the same words."""
        spec = context.definition.spec
        only = spec.only_task if running else None
        told = None if only is None else (only, context.job_name(task_key=only, attempt=1))
        notice = notices.run_started(
            workflow=spec.workflow, version=spec.version, tasks=spec.forward_count, only=told
        )
        if told is None:
            self.notifier.post(context, notice)
        else:
            self.notifier.announce(context, notice, job=told[1])

    def _show_final(self, body: Mapping[str, Any], *, run_id: int, phase: RunPhase) -> None:
        """Re-project a finished run whose object does not show its final phase yet (e.g. a
        crash before its last status patch)."""
        if shown_phase(body) != phase.value:
            self.status.mark(run_id, force=True)

    async def on_deferred(self, key: Deferred) -> None:
        """Deferred work is due: act on the run's context as it is now."""
        context = await self.runs.by_id(key.run_id)
        job = key.job
        match key.purpose:
            case Purpose.WAKE:
                await self.wake(context)
            case Purpose.WRITE_EVENTS:
                await self.notifier.flush_series(context, key.reason)
            case Purpose.DELETE_JOB if job is not None:
                await self.launcher.delete(context, job)
            case Purpose.WATCH_JOB if job is not None:
                await self.watchdog.check(context, job)
            case Purpose.CREATE_JOB if job is not None:
                await self.launcher.create_again(context, job)

    def cached_runs(self) -> int:
        """Entries this process keeps per run (contexts, sightings, delayed creations, last
        patched projections, ConfigMaps made, Event counts): bounded by the active runs, none
        for a finished one (but its series Events not yet written)."""
        return (  # finished runs' phases are not counted: a bounded, constant memory
            len(self.runs)
            + len(self.runs.started | self.runs.cancelled)
            + self.delays.runs()
            + len(self.status)
            + self.launcher.cached_runs()
            + len(self.notifier)
        )

    async def policy_changed(self, namespace: str) -> None:
        """Copy the namespace's limits from its FlowForgePolicy objects into the store (an
        invalid one counts as none: admission and the launcher refuse everything it governs)
        and hand the policies to the launcher, which judges every Job against them; what may
        start under new limits starts."""
        objects = await self.kube.list_policies(namespace=namespace)
        # the launcher judges each Job against them from now on
        policies = self.launcher.policies.update(namespace, objects)
        others = await set_namespace_limits(
            self.pool,
            fence=self.fence(),
            namespace=namespace,
            limits=namespace_limits([policy.spec for policy in policies]),
        )
        self._limits_read.add(namespace)
        await self.applier.apply_elsewhere(others)

    async def _refuse(self, body: Mapping[str, Any], message: str, *, reason: str) -> None:
        metadata = body["metadata"]
        generation = metadata.get("generation")
        await self.kube.patch_run_status(
            namespace=metadata["namespace"],
            name=metadata["name"],
            status=refused_status(
                message=message,
                now=datetime.now(UTC).replace(microsecond=0),
                generation=generation if isinstance(generation, int) else None,
                reason=reason,
            ),
        )
        notice = notices.run_refused(message)
        await self.kube.post_run_event(
            RunEvent(metadata["namespace"], metadata["name"], metadata["uid"], notice)
        )

    async def run_deleted(self, body: Mapping[str, Any]) -> None:
        """The WorkflowRun is gone: its Jobs go by garbage collection; the store keeps the
        history and records the run as cancelled."""
        metadata = body["metadata"]
        self._refused.discard(str(metadata["uid"]))
        context = await self.runs.by_uid(namespace=metadata["namespace"], uid=metadata["uid"])
        if context is not None:
            await self.run_gone(context)

    async def run_gone(self, context: RunContext) -> None:
        """Cancel the run and skip what is left of its rollback: with the WorkflowRun gone,
        the garbage collector removes every Job it owns, compensators' included."""
        await self._move(
            context,
            "cancel_run",
            cancel_run(
                self.pool,
                fence=self.fence(),
                run_id=context.run_id,
                reason="the WorkflowRun was deleted",
                rollback=False,
            ),
        )

    async def cancel(self, context: RunContext, *, reason: str) -> None:
        await self._move(
            context,
            "cancel_run",
            cancel_run(self.pool, fence=self.fence(), run_id=context.run_id, reason=reason),
        )

    async def dispatch(self, context: RunContext) -> None:
        await self._move(
            context,
            "dispatch_due",
            dispatch_due(self.pool, fence=self.fence(), run_id=context.run_id),
        )

    async def settle(self, context: RunContext) -> None:
        """Finish the run, or start its rollback or its next compensator, if it may."""
        await self._move(
            context,
            "settle_run",
            settle_run(
                self.pool,
                fence=self.fence(),
                run_id=context.run_id,
                gates=context.definition.spec.has_gates,
            ),
        )

    async def wake(self, context: RunContext) -> None:
        """A backoff is over: dispatch the retries that are due, and the next compensator."""
        await self.dispatch(context)
        await self.settle(context)

    async def _move(self, context: RunContext, name: str, move: Any) -> None:
        with metrics.store_timer(name):
            decision: Decision = await move
        await self.applier.apply(context, decision)

    async def on_job_event(self, job: Mapping[str, Any], event_type: str | None) -> None:
        """A Job changed or was deleted: record its attempt's outcome (or that it was lost,
        or its Kueue admission) if it is the run's own Job; a copy with the run's labels
        changes nothing."""
        identity = JobIdentity.of(job)
        if identity is None or (identity.uid is not None and identity.uid in self._recorded_jobs):
            return  # not ours, or its outcome (e.g. from its Pod) is recorded
        received = time.perf_counter()
        meaning = job_meaning(job, deleted=event_type == "DELETED")
        if meaning is JobMeaning.ADMISSION:
            await self.admissions.on_job_event(job, identity)
            return
        if meaning is JobMeaning.RUNNING:
            return
        context = await self.runs.by_uid(namespace=identity.namespace, uid=identity.run_uid)
        if context is None:
            return
        act = "vanished" if meaning is JobMeaning.VANISHED else "outcome"
        if not await self.launcher.owns(context, identity, act=act):
            return
        if meaning is JobMeaning.VANISHED:
            await self.vanished(context, identity)
            return
        await self.finished(context, identity, job, received=received)

    async def on_pod_event(self, pod: Mapping[str, Any], event_type: str | None) -> None:
        """A Pod of a run's Job succeeded: record its attempt's success now, about a second
        before the Job's status can say it, when it is a Pod the Job controller counts for the
        Job this process created and recorded for the attempt (``domain/observed_pod.py``).
        Anything else is left to the Job watch, the complete fallback: a forgery is ignored
        and counted, and so is a Pod of a Job this process did not record (created before a
        restart, under another leader, or one whose uid is not yet known to it)."""
        if event_type == "DELETED":
            return  # a deletion proves nothing the Pod's last change did not
        received = time.perf_counter()
        pod_uid = str((pod.get("metadata") or {}).get("uid") or "")
        if pod_uid and tracked(pod):
            self._tracked_pods[pod_uid] = None
        claim = job_claim(pod)
        if isinstance(claim, PodIgnored):
            self._ignore_pod(pod, claim)
            return
        if claim.job_uid in self._recorded_jobs:
            return
        forged = files_forged(pod)
        if not forged and task_container_success(pod) is None:
            return  # running or failed, its files intact: the Job watch decides
        found = await self.launcher.job_of_pod(claim)
        if isinstance(found, PodIgnored):
            self._ignore_pod(pod, found)
            return
        run_id, job = found
        if forged and claim.namespace == job.namespace:
            owned = dataclasses.replace(job, uid=claim.job_uid)
            await self._forged_files(await self.runs.by_id(run_id), owned, pod, uid=claim.job_uid)
            return
        verdict = pod_verdict(
            pod,
            claim=claim,
            recorded=RecordedJob(namespace=job.namespace, name=job.name, uid=claim.job_uid),
            tracked_before=pod_uid in self._tracked_pods,
        )
        if verdict is not None:
            self._ignore_pod(pod, verdict)
            return
        context = await self.runs.by_id(run_id)
        outcome = pod_outcome(pod)
        decision = await self._record(context, identity=job, outcome=outcome, received=received)
        if decision.recorded:
            metrics.POD_SUCCESSES.inc()

    async def _forged_files(
        self, context: RunContext, job: JobIdentity, pod: Mapping[str, Any], *, uid: str
    ) -> None:
        """The run's own Pod had its files annotation changed: its attempt fails (no success
        is read from it), then its Job is deleted (the recorded uid only)."""
        metrics.FORGED_JOBS.labels("mount").inc()
        metadata = pod.get("metadata") or {}
        logger.warning(
            "Pod %s/%s of Job %s: its files annotation was changed",
            metadata.get("namespace"),
            metadata.get("name"),
            job.name,
        )
        notice = notices.forged_pod(
            namespace=job.namespace,
            name=str(metadata.get("name")),
            task_key=job.task_key,
            attempt=job.attempt,
        )
        self.notifier.post(context, notice)
        outcome = forged_files_outcome(pod, now=datetime.now(UTC))
        await self.record(context, identity=job, outcome=outcome)
        await self.kube.delete_job(namespace=job.namespace, name=job.name, uid=uid)

    def _ignore_pod(self, pod: Mapping[str, Any], why: PodIgnored) -> None:
        if not why.forged:
            return
        metrics.FORGED_PODS.labels(why.value).inc()
        metadata = pod.get("metadata") or {}
        logger.warning(
            "ignored Pod %s/%s (uid %s): %s",
            metadata.get("namespace"),
            metadata.get("name"),
            metadata.get("uid"),
            why.value,
        )

    async def finished(
        self,
        context: RunContext,
        identity: JobIdentity,
        job: Mapping[str, Any],
        *,
        received: float | None = None,
    ) -> None:
        """The run's own Job of an attempt finished: record its outcome."""
        outcome = await self._observed_outcome(job, identity)
        if outcome is not None:
            await self.record(context, identity=identity, outcome=outcome, received=received)

    async def vanished(self, context: RunContext, identity: JobIdentity) -> None:
        """The run's own Job of a running attempt is gone: the attempt is lost, unless the
        run is gone too (its Jobs go with it)."""
        body = await self.kube.read_run(namespace=context.namespace, name=context.name)
        if run_gone(body, uid=context.uid):
            await self.run_gone(context)
            return
        outcome = lost_outcome(job=identity.name, now=datetime.now(UTC))
        await self.record(context, identity=identity, outcome=outcome)

    async def _observed_outcome(
        self, job: Mapping[str, Any], identity: JobIdentity
    ) -> AttemptOutcome | None:
        status = job.get("status") or {}
        outcome = job_outcome(status)
        if outcome is None or outcome.succeeded or outcome.reason is not OutcomeReason.JOB_FAILED:
            return outcome
        if identity.uid is None:
            return outcome  # no uid, no Pod it provably owns
        container = await self.kube.job_termination(
            namespace=identity.namespace, job_name=identity.name, job_uid=identity.uid
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
        """Record how an attempt (of a task or a compensator) ended and act on it."""
        await self._record(context, identity=identity, outcome=outcome, received=received)

    async def _record(
        self,
        context: RunContext,
        *,
        identity: JobIdentity,
        outcome: AttemptOutcome,
        received: float | None,
    ) -> Decision:
        """``record``; the decision says whether this move recorded the outcome."""
        stored_at = time.perf_counter()
        with metrics.store_timer("record_outcome"):
            decision = await record_outcome(
                self.pool,
                fence=self.fence(),
                run_id=context.run_id,
                run_uid=context.uid,
                job=JobRef(
                    task_key=identity.task_key, attempt=identity.attempt, role=identity.role
                ),
                outcome=outcome,
                backoff=self.settings.backoff,
                gates=context.definition.spec.has_gates,
            )
        decided_at = time.perf_counter()
        if identity.uid is not None:  # recorded now or before: later news of the Job is moot
            self._recorded_jobs[identity.uid] = None
        if decision.recorded:
            self.launcher.attempt_over(
                context, JobRef(identity.task_key, identity.attempt, identity.role)
            )
        await self.applier.apply(context, decision, received=received)
        if received is not None and decision.create_jobs:
            done = time.perf_counter()
            if done - received > SLOW_HANDOFF_SECONDS:
                logger.info(
                    "slow hand-off after %s: %.0f ms before the store, %.0f ms in the "
                    "store, %.0f ms applying (%d Jobs)",
                    identity.name,
                    (stored_at - received) * 1000,
                    (decided_at - stored_at) * 1000,
                    (done - decided_at) * 1000,
                    len(decision.create_jobs),
                )
        return decision

    async def fail_attempt(self, context: RunContext, job: JobRef, outcome: AttemptOutcome) -> None:
        """An attempt failed before its Job ran (refused, or its Pod never started)."""
        await self.record(context, identity=attempt_identity(context, job), outcome=outcome)
