"""Jobs of running attempts: created after the decision that dispatched them committed, and
told apart from every other Job.

A Job's name is a function of (run, task, attempt, role), so creating it twice is harmless
(AlreadyExists counts as created when the existing Job's controller is the run; a Job of
that name the run does not control fails the attempt, ``JobNameTaken``) and the
reconciler can always tell which Job an attempt should have. A ``task.job_created`` event
with the Job's uid follows every creation (one statement records all the Jobs of a
decision): that is how a Job that vanished is told from one that was never created, and
the run's own Job from a copy. Labels and annotations are only a claim (anyone who may
create a Job anywhere can copy them), so an outcome, a vanished verdict or a cleanup is
accepted only for the Job in the run's namespace with the recorded uid (before one is
recorded: the attempt's name, with the run as controller owner). Any other Job is a
forgery: ignored, counted, and reported on the run (once per forged Job, and a few times
an hour per run at most).

Before each Job is sent, the namespace's policy as it is now judges it (`job_policy`: a
refusal fails the attempt ``PolicyRefused``, no Job is made) and, when the Job mounts it, the
run's ConfigMap is checked to be the one the run created (`run_files`: by uid; a Job whose
files are both ``{}`` reads them from its Pod's annotation, `kube/jobs.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from flowforge.domain import notices
from flowforge.domain.decision import Dispatch, JobRef
from flowforge.domain.execution import (
    AttemptOutcome,
    name_taken_outcome,
    policy_refused_outcome,
    refused_outcome,
)
from flowforge.domain.for_each import is_instance
from flowforge.domain.kueue import queueing
from flowforge.domain.observed_pod import JobClaim, PodIgnored
from flowforge.domain.states import TaskRole, TaskState
from flowforge.kube.errors import KubernetesError
from flowforge.kube.jobs import ItemRef, JobIdentity, JobRequest, build_job, mounts_config_map
from flowforge.operator import metrics, tracing
from flowforge.operator.background import Background, Deferred, Purpose
from flowforge.operator.creation_delays import CreationDelays, transient
from flowforge.operator.creation_turns import CreationTurns
from flowforge.operator.job_policy import NamespacePolicies
from flowforge.operator.kubeport import KubePort
from flowforge.operator.notifier import Notifier
from flowforge.operator.run_files import ForgedConfigMap, RunFiles
from flowforge.operator.runs import RunContext
from flowforge.store.connection import Pool
from flowforge.store.dispatch import JobCreated, record_jobs_created
from flowforge.store.final_tasks import decided_outcome
from flowforge.store.items import task_item
from flowforge.store.lease import Fence
from flowforge.store.queries import active_tasks, recorded_job_uid, recorded_jobs
from flowforge.store.settle import undo_reason

logger = logging.getLogger(__name__)

# Warning Events about forged Jobs: one per forged Job (by uid), and at most this many per
# run in an hour, however many Jobs an attacker creates; the counter counts every one
FORGERY_NOTICES_PER_RUN = 5
FORGERY_NOTICE_WINDOW_SECONDS = 3600.0
_REMEMBERED_FORGERIES = 10_000
# uids of Jobs this process created and recorded, for attempts still running
_REMEMBERED_UIDS = 100_000

# the engine records an attempt that failed before its Job ran (refused, never started)
FailAttempt = Callable[[RunContext, JobRef, AttemptOutcome], Awaitable[None]]


def forgery_cause(
    context: RunContext, identity: JobIdentity, *, recorded_uid: str | None
) -> str | None:
    """Why the Job ``identity`` describes is not the run's Job for the attempt it claims
    (``namespace``, ``uid``, ``name``, ``owner``), or None when it is. ``recorded_uid``: the
    uid recorded when the attempt's Job was created (None: none recorded yet)."""
    if identity.namespace != context.namespace:
        return "namespace"
    if identity.run_uid != context.uid:
        return "owner"
    if recorded_uid is not None:
        return None if identity.uid == recorded_uid else "uid"
    expected = context.job_name(
        task_key=identity.task_key, attempt=identity.attempt, role=identity.role
    )
    if identity.name != expected:
        return "name"
    if identity.controller_uid != context.uid:
        return "owner"
    return None


def attempt_identity(context: RunContext, job: JobRef) -> JobIdentity:
    """What the attempt's own Job is called and claims (its uid and controller unknown)."""
    return JobIdentity(
        namespace=context.namespace,
        name=context.job_name(task_key=job.task_key, attempt=job.attempt, role=job.role),
        run_uid=context.uid,
        task_key=job.task_key,
        attempt=job.attempt,
        role=job.role,
    )


def found_job(claim: JobIdentity, job: Mapping[str, Any]) -> JobIdentity:
    """The Job found under the name of the attempt ``claim``: what it claims is the attempt
    (its labels do not matter), its namespace, uid and controller are its own."""
    metadata = job["metadata"]
    return dataclasses.replace(
        claim,
        namespace=str(metadata.get("namespace") or claim.namespace),
        uid=metadata.get("uid"),
        controller_uid=JobIdentity.run_controller(metadata),
    )


class ForgeryNotices:
    """Decides which forgeries get a Warning Event: the first sighting of each forged Job,
    and no more than ``FORGERY_NOTICES_PER_RUN`` per run in the window."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, None] = {}  # insertion-ordered, the oldest forgotten first
        self._posted: dict[int, deque[float]] = {}

    def allow(self, *, run_id: int, job_key: str) -> bool:
        if job_key in self._seen:
            return False
        self._seen[job_key] = None
        if len(self._seen) > _REMEMBERED_FORGERIES:
            del self._seen[next(iter(self._seen))]
        now = self._clock()
        posted = self._posted.setdefault(run_id, deque())
        while posted and now - posted[0] > FORGERY_NOTICE_WINDOW_SECONDS:
            posted.popleft()
        if len(posted) >= FORGERY_NOTICES_PER_RUN:
            return False
        posted.append(now)
        return True

    def forget_run(self, run_id: int) -> None:
        """The run finished: its notice budget goes (the forged Jobs seen stay, bounded)."""
        self._posted.pop(run_id, None)


class RecordedUids:
    """The uids this process recorded with ``task.job_created``, so the ownership check of a
    finished Job does not read the store on the hand-off path, and a Pod's Job (by its uid)
    is known without a read (``engine.py::on_pod_event``). An entry counts only under the
    epoch that recorded it: after a change of leader the store may hold a newer uid, so the
    store is asked again. Bounded: an attempt's entry goes when its outcome is recorded, a
    run's when it finishes, and the oldest run's first beyond ``_REMEMBERED_UIDS``.

    A Job's uid is known from the create response, before the store has it: between the two
    it is ``expect``-ed, and a Pod of it waits (``recorded``) for the store write rather than
    being taken for an unknown Job's."""

    def __init__(self) -> None:
        # run -> (task, attempt) -> (epoch, uid); runs in the order they were first seen
        self._runs: dict[int, dict[tuple[str, int], tuple[int, str]]] = {}
        self._count = 0
        # Job uid -> (epoch, run, its Job), and (namespace, Job name) -> Job uid
        self._jobs: dict[str, tuple[int, int, JobIdentity]] = {}
        self._names: dict[tuple[str, str], str] = {}
        self._pending: dict[str, asyncio.Event] = {}  # created, its record not yet stored

    def remember(
        self,
        *,
        epoch: int,
        run_id: int,
        task_key: str,
        attempt: int,
        uid: str,
        job: JobIdentity | None = None,
    ) -> None:
        """``job``: the Job itself (where it is and which attempt it runs), for its Pods."""
        attempts = self._runs.setdefault(run_id, {})
        if (task_key, attempt) not in attempts:
            self._count += 1
        else:
            self._drop_job(attempts[(task_key, attempt)][1])
        attempts[(task_key, attempt)] = (epoch, uid)
        if job is not None:
            self._jobs[uid] = (epoch, run_id, job)
            self._names[(job.namespace, job.name)] = uid
        while self._count > _REMEMBERED_UIDS:
            self.forget_run(next(iter(self._runs)))

    def expect(self, uid: str) -> None:
        """The Job ``uid`` was created; its record is being written."""
        self._pending.setdefault(uid, asyncio.Event())

    def settled(self, uid: str) -> None:
        """The record of the Job ``uid`` was written (``remember``-ed) or failed."""
        pending = self._pending.pop(uid, None)
        if pending is not None:
            pending.set()

    def lookup(self, *, epoch: int, run_id: int, task_key: str, attempt: int) -> str | None:
        entry = self._runs.get(run_id, {}).get((task_key, attempt))
        return entry[1] if entry is not None and entry[0] == epoch else None

    async def recorded(self, *, epoch: int, uid: str) -> tuple[int, JobIdentity] | None:
        """The run and attempt of the Job ``uid`` this process recorded under ``epoch``
        (waiting for a record being written), or None."""
        pending = self._pending.get(uid)
        if pending is not None:
            await pending.wait()
        entry = self._jobs.get(uid)
        return (entry[1], entry[2]) if entry is not None and entry[0] == epoch else None

    def named(self, *, namespace: str, name: str) -> str | None:
        """The uid recorded for the Job ``name`` in ``namespace``, if this process has one."""
        return self._names.get((namespace, name))

    def forget(self, *, run_id: int, task_key: str, attempt: int) -> None:
        attempts = self._runs.get(run_id)
        entry = None if attempts is None else attempts.pop((task_key, attempt), None)
        if entry is not None:
            self._count -= 1
            self._drop_job(entry[1])

    def forget_run(self, run_id: int) -> None:
        """The run finished: the entries of attempts whose outcome was never recorded here
        (cancelled, stopped) go too."""
        attempts = self._runs.pop(run_id, {})
        self._count -= len(attempts)
        for _, uid in attempts.values():
            self._drop_job(uid)

    def _drop_job(self, uid: str) -> None:
        entry = self._jobs.pop(uid, None)
        if entry is not None:
            self._names.pop((entry[2].namespace, entry[2].name), None)

    def __len__(self) -> int:
        return self._count


@dataclasses.dataclass(frozen=True)
class _Sent:
    """A Job the apiserver holds for an attempt, to be recorded (``created`` False: it
    existed, and the run controls it)."""

    ref: JobRef
    name: str
    uid: str
    created: bool
    queued: bool  # a Kueue Job: admitted before it starts

    @property
    def attempt_key(self) -> tuple[str, int]:
        return (self.ref.task_key, self.ref.attempt)


@dataclasses.dataclass(frozen=True)
class AttemptHooks:
    """What the launcher hands back to the engine: attempts that failed before their Job
    ran, and the admission timeout of the Kueue Jobs it created."""

    fail: FailAttempt
    delays: CreationDelays
    default_pending_timeout: float
    mark: Callable[[int], None]  # the run's status is to be re-projected
    # a Kueue Job was created: check its admission when its admissionTimeoutSeconds is over
    check_admission: Callable[[RunContext, JobRef], None]


class JobLauncher:
    def __init__(
        self,
        *,
        kube: KubePort,
        pool: Pool,
        fence: Callable[[], Fence],
        notifier: Notifier,
        background: Background,
        hooks: AttemptHooks,
        turns: CreationTurns,
    ) -> None:
        """``turns``: the rate of Job creations, shared between namespaces in turn."""
        self._kube = kube
        self._pool = pool
        self._fence = fence
        self._notifier = notifier
        self._background = background
        self._hooks = hooks
        self.turns = turns
        self.forgeries = ForgeryNotices()
        self.uids = RecordedUids()
        self.files = RunFiles(kube, pool)
        self.policies = NamespacePolicies(kube, epoch=lambda: fence().epoch)

    def forget(self, context: RunContext) -> None:
        """The run finished: drop its delayed creations, forgery notices, recorded uids and
        ConfigMap mark."""
        self._hooks.delays.forget_run(context.run_id)
        self.forgeries.forget_run(context.run_id)
        self.uids.forget_run(context.run_id)
        self.files.forget(context)

    async def job_of_pod(self, claim: JobClaim) -> tuple[int, JobIdentity] | PodIgnored:
        """The run and attempt of the Job a Pod claims, if this process recorded that Job
        under the current epoch (waiting for a record being written); else why the Pod
        decides nothing: a Job unknown here (or recorded under another epoch), or another
        uid than the one recorded for that Job's name."""
        found = await self.uids.recorded(epoch=self._fence().epoch, uid=claim.job_uid)
        if found is not None:
            return found
        named = self.uids.named(namespace=claim.namespace, name=claim.job_name)
        unknown = named is None or named == claim.job_uid
        return PodIgnored.UNKNOWN if unknown else PodIgnored.UID

    def attempt_over(self, context: RunContext, job: JobRef) -> None:
        """The attempt's outcome is recorded: no pending-timeout check of its Pod, and its
        Job's uid is no longer needed."""
        self._background.cancel(Deferred(context.run_id, Purpose.WATCH_JOB, job=job))
        self.uids.forget(run_id=context.run_id, task_key=job.task_key, attempt=job.attempt)

    def cached_runs(self) -> int:
        """Runs whose ConfigMap this process remembers making (the rest is per attempt)."""
        return len(self.files)

    def pending_timeout(self, context: RunContext, task_key: str) -> float:
        """Seconds the attempt's Pod may take to start: its task type's, else the default."""
        spec = context.definition.spec
        own = spec.task_types[spec.job_type(task_key)].pending_timeout_seconds
        return float(own) if own is not None else self._hooks.default_pending_timeout

    def schedule_start_check(self, context: RunContext, job: JobRef) -> None:
        """Have the watchdog look, once the pending timeout is over, whether the attempt's
        Pod started."""
        self._background.later(
            self.pending_timeout(context, job.task_key) + 1.0,
            Deferred(context.run_id, Purpose.WATCH_JOB, job=job),
        )

    async def create_all(
        self, context: RunContext, dispatched: Sequence[Dispatch], *, received: float | None
    ) -> None:
        """Create the Jobs of attempts a transaction moved to running, concurrently, and
        record those that exist with one store statement (``record_jobs_created``).
        ``received``: when the event that released them arrived (hand-off latency).

        A Job's uid is ``expect``-ed from its create response on (a Pod of it waits for the
        record), and settled however the record ends. A creation that raised does not keep
        its siblings' Jobs from being recorded; its error is raised after the record."""
        if not dispatched:
            return
        expected: list[str] = []
        try:
            sends = (
                self._send(context, item, received=received, expected=expected)
                for item in dispatched
            )
            results = await asyncio.gather(*sends, return_exceptions=True)
            made = [result for result in results if isinstance(result, _Sent)]
            cancelled = await self._record(context, made) if made else frozenset()
        finally:
            for uid in expected:
                self.uids.settled(uid)
        await asyncio.gather(
            *(
                self._started(context, sent, cancelled=sent.attempt_key in cancelled)
                for sent in made
            )
        )
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise failures[0]

    async def create(self, context: RunContext, item: Dispatch) -> None:
        """Create the Job of a running attempt (idempotent) and record that it exists, when
        the namespace's policy as it is now allows it."""
        await self.create_all(context, (item,), received=None)

    async def _item(self, context: RunContext, task_key: str) -> ItemRef | None:
        """The item of a forEach instance (as recorded when the run was created)."""
        if not is_instance(task_key):
            return None
        found = await task_item(self._pool, run_id=context.run_id, task_key=task_key)
        return None if found is None else ItemRef(*found)

    async def _send(
        self, context: RunContext, item: Dispatch, *, received: float | None, expected: list[str]
    ) -> _Sent | None:
        """Create the Job of a running attempt (idempotent), when the namespace's policy as
        it is now allows it; None when there is none to record (the attempt failed or its
        creation is to be tried again). The Job's uid goes to ``expected``."""
        spec = context.definition.spec
        task = spec.task(item.task_key)
        job_type = spec.job_type(item.task_key)
        refusal = await self.policies.refusal(context, job_type)
        if refusal is not None:
            await self._refused_by_policy(context, item, message=refusal)
            return None
        template = spec.task_types[job_type]
        queued = queueing(spec, job_type)
        outcome = None
        if item.role is TaskRole.FINALLY:  # told the run's decided outcome
            phase, rollback = await decided_outcome(self._pool, context.run_id)
            outcome = (phase.value, rollback.value)
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
            queue_name=queued.queue_name if queued else None,
            priority_class=queued.priority_class if queued else None,
            traceparent=tracing.job_traceparent(
                context, role=item.role, task_key=item.task_key, attempt=item.attempt
            ),
            undo_of=(
                await undo_reason(self._pool, run_id=context.run_id, task_key=item.task_key)
                if item.role is TaskRole.COMPENSATION
                else None
            ),
            item=await self._item(context, item.task_key),
            run_outcome=outcome,
        )
        try:  # the run's ConfigMap first, when the Job mounts it
            if mounts_config_map(request):
                await self.files.ensure(context)
            await self.turns.take(context.namespace)
            job = await self._kube.create_job(build_job(request))
        except KubernetesError as error:
            if isinstance(error, ForgedConfigMap):
                metrics.FORGED_JOBS.labels("mount").inc()
                notice = notices.forged_config_map(
                    name=error.name, uid=error.found, task_key=item.task_key, attempt=item.attempt
                )
                self._notifier.post(context, notice)
            await self._not_created(context, item, name=request.name, error=error)
            return None
        self._hooks.delays.cleared((context.run_id, item.task_key, item.attempt))
        if received is not None:
            metrics.HANDOFF_LATENCY.observe(time.perf_counter() - received)
        ref = JobRef(item.task_key, item.attempt, item.role)
        if not job.created and job.controller_uid != context.uid:
            # the name is taken by a Job that is not the run's: never adopted nor deleted;
            # the attempt fails (waiting for the name could hang the task forever)
            claimed = dataclasses.replace(
                attempt_identity(context, ref), uid=job.uid, controller_uid=job.controller_uid
            )
            self.report_forgery(context, claimed, cause="owner", act="adopt")
            now = datetime.now(UTC)
            await self._hooks.fail(context, ref, name_taken_outcome(job=request.name, now=now))
            return None
        if job.created:
            metrics.JOBS_CREATED.labels(item.role.value).inc()
        self.uids.expect(job.uid)  # a Pod of it seen before the store has it waits
        expected.append(job.uid)
        return _Sent(
            ref=ref, name=request.name, uid=job.uid, created=job.created, queued=bool(queued)
        )

    async def _record(
        self, context: RunContext, made: Sequence[_Sent]
    ) -> frozenset[tuple[str, int]]:
        """Record the Jobs ``made`` with one statement and remember their uids; the attempts
        cancelled meanwhile."""
        fence = self._fence()
        cancelled = await record_jobs_created(
            self._pool,
            fence=fence,
            run_id=context.run_id,
            jobs=[
                JobCreated(
                    task_key=sent.ref.task_key,
                    attempt=sent.ref.attempt,
                    job=sent.name,
                    uid=sent.uid,
                    created=sent.created,
                )
                for sent in made
            ],
        )
        for sent in made:
            self.uids.remember(
                epoch=fence.epoch,
                run_id=context.run_id,
                task_key=sent.ref.task_key,
                attempt=sent.ref.attempt,
                uid=sent.uid,
                job=dataclasses.replace(
                    attempt_identity(context, sent.ref), uid=sent.uid, controller_uid=context.uid
                ),
            )
        return cancelled

    async def _started(self, context: RunContext, sent: _Sent, *, cancelled: bool) -> None:
        """The recorded Job is watched (its start or admission); one a cancel has overtaken
        is deleted; a new one is announced."""
        if sent.queued:  # the pending timeout counts from admission; the admission's from now
            self._hooks.check_admission(context, sent.ref)
        else:
            self.schedule_start_check(context, sent.ref)
        if cancelled:
            # a cancel committed between the dispatch and this creation and found no Job
            # to stop; its outcome (cancelled) is recorded, so the Job may go
            await self._kube.delete_job(namespace=context.namespace, name=sent.name, uid=sent.uid)
            return
        if not sent.created:
            return
        if sent.ref.role is TaskRole.COMPENSATION:
            task = context.definition.spec.task(sent.ref.task_key)
            notice = notices.compensation_started(
                task_key=sent.ref.task_key,
                compensates=str(task.compensate_for),
                attempt=sent.ref.attempt,
                job=sent.name,
            )
        elif self._notifier.started(context, job=sent.name):
            notice = notices.task_started(
                task_key=sent.ref.task_key, attempt=sent.ref.attempt, job=sent.name
            )
        else:
            return  # the run's RunStarted Event told it
        self._notifier.post(context, notice)

    async def _refused_by_policy(
        self, context: RunContext, item: Dispatch, *, message: str
    ) -> None:
        """The policy was tightened since the run was admitted: no Job; the attempt fails
        (``PolicyRefused``) and retries or rollback follow as for any failure."""
        ref = JobRef(item.task_key, item.attempt, item.role)
        name = context.job_name(task_key=item.task_key, attempt=item.attempt, role=item.role)
        self._hooks.delays.cleared((context.run_id, item.task_key, item.attempt))
        metrics.JOB_CREATION_FAILURES.labels("policy").inc()
        logger.warning("Job %s/%s refused by policy: %s", context.namespace, name, message)
        self._notifier.post(
            context,
            notices.policy_refused(
                task_key=item.task_key, attempt=item.attempt, job=name, message=message
            ),
        )
        outcome = policy_refused_outcome(job=name, message=message, now=datetime.now(UTC))
        await self._hooks.fail(context, ref, outcome)

    async def _not_created(
        self, context: RunContext, item: Dispatch, *, name: str, error: KubernetesError
    ) -> None:
        """The apiserver did not create the attempt's Job: try again later when it may take
        it then (the attempt stays running, and says why), else fail the attempt."""
        key = (context.run_id, item.task_key, item.attempt)
        ref = JobRef(item.task_key, item.attempt, item.role)
        if not transient(error):
            self._hooks.delays.cleared(key)
            metrics.JOB_CREATION_FAILURES.labels("refused").inc()
            logger.warning("Job %s/%s refused: %s", context.namespace, name, error.message)
            outcome = refused_outcome(
                job=name,
                message=error.message,
                now=datetime.now(UTC),
                namespace_terminating=error.namespace_terminating,
            )
            await self._hooks.fail(context, ref, outcome)
            return
        metrics.JOB_CREATION_FAILURES.labels("delayed").inc()
        delay, notify = self._hooks.delays.delayed(key, error.message)
        logger.warning(
            "Job %s/%s not created, next try in %.0f s: %s",
            context.namespace,
            name,
            delay,
            error.message,
        )
        if notify:
            notice = notices.job_creation_delayed(
                task_key=item.task_key,
                attempt=item.attempt,
                job=name,
                message=error.message,
                retry_in=delay,
            )
            self._notifier.post(context, notice)
        self._hooks.mark(context.run_id)
        self._background.later(delay, Deferred(context.run_id, Purpose.CREATE_JOB, job=ref))

    async def create_again(self, context: RunContext, job: JobRef) -> None:
        """Try again to create the Job of an attempt whose creation the apiserver delayed,
        if the attempt is still running."""
        self._fence()  # a deposed operator leaves it to the leader's reconciler
        rows = await active_tasks(self._pool, context.run_id)
        row = next(
            (
                row
                for row in rows
                if (row.task_key, row.attempt, row.role) == (job.task_key, job.attempt, job.role)
                and row.state == TaskState.RUNNING
            ),
            None,
        )
        if row is None:
            self._hooks.delays.cleared((context.run_id, job.task_key, job.attempt))
            return  # cancelled or resolved meanwhile
        await self.create(context, Dispatch.of(row))

    async def owns(self, context: RunContext, identity: JobIdentity, *, act: str) -> bool:
        """Whether the Job is the run's own for the attempt it claims (the recorded uid is
        the one this process recorded under the current epoch, else read from the store); a
        forgery is reported (``act``: what it would have caused)."""
        recorded = None
        if identity.namespace == context.namespace:
            recorded = self.uids.lookup(
                epoch=self._fence().epoch,
                run_id=context.run_id,
                task_key=identity.task_key,
                attempt=identity.attempt,
            ) or await recorded_job_uid(
                self._pool,
                run_id=context.run_id,
                task_key=identity.task_key,
                attempt=identity.attempt,
            )
        return self.check(context, identity, act=act, recorded_uid=recorded)

    async def own_job(
        self, context: RunContext, job: JobRef, body: Mapping[str, Any], *, act: str
    ) -> JobIdentity | None:
        """The Job ``body`` found under the attempt's name, when it is the run's own (the
        recorded uid); None for a copy (reported) or a Job without a uid."""
        identity = found_job(attempt_identity(context, job), body)
        recorded = await recorded_job_uid(
            self._pool, run_id=context.run_id, task_key=job.task_key, attempt=job.attempt
        )
        if identity.uid is None or not self.check(
            context, identity, act=act, recorded_uid=recorded
        ):
            return None
        return identity

    def check(
        self, context: RunContext, identity: JobIdentity, *, act: str, recorded_uid: str | None
    ) -> bool:
        """``owns`` with the recorded uid already read."""
        cause = forgery_cause(context, identity, recorded_uid=recorded_uid)
        if cause is None:
            return True
        self.report_forgery(context, identity, cause=cause, act=act)
        return False

    def report_forgery(
        self, context: RunContext, identity: JobIdentity, *, cause: str, act: str
    ) -> None:
        metrics.FORGED_JOBS.labels(act).inc()
        logger.warning(
            "ignored Job %s/%s (uid %s) claiming %s/%s task %s attempt %d: %s (%s)",
            identity.namespace,
            identity.name,
            identity.uid,
            context.namespace,
            context.name,
            identity.task_key,
            identity.attempt,
            cause,
            act,
        )
        key = identity.uid or f"{identity.namespace}/{identity.name}"
        if self.forgeries.allow(run_id=context.run_id, job_key=key):
            notice = notices.forged_job(
                namespace=identity.namespace,
                name=identity.name,
                uid=identity.uid or "unknown",
                task_key=identity.task_key,
                attempt=identity.attempt,
                cause=cause,
                act=act,
            )
            self._notifier.post(context, notice)

    async def delete_all(self, context: RunContext, jobs: Sequence[JobRef]) -> None:
        """Delete the run's own Jobs of these attempts (one read of the recorded uids)."""
        if not jobs:
            return
        recorded = await recorded_jobs(self._pool, context.run_id)
        await asyncio.gather(
            *(
                self._delete(context, job, recorded_uid=recorded.get((job.task_key, job.attempt)))
                for job in jobs
            )
        )

    async def delete(self, context: RunContext, job: JobRef) -> bool:
        """Delete the attempt's Job if it is the run's own; False when there is none."""
        recorded = await recorded_job_uid(
            self._pool, run_id=context.run_id, task_key=job.task_key, attempt=job.attempt
        )
        return await self._delete(context, job, recorded_uid=recorded)

    async def _delete(self, context: RunContext, job: JobRef, *, recorded_uid: str | None) -> bool:
        name = context.job_name(task_key=job.task_key, attempt=job.attempt, role=job.role)
        uid = recorded_uid
        if uid is None:  # not recorded (yet): the Job of that name, if the run controls it
            body = await self._kube.read_job(namespace=context.namespace, name=name)
            if body is None:
                return False
            found = found_job(attempt_identity(context, job), body)
            if not self.check(context, found, act="cleanup", recorded_uid=None):
                return False
            uid = found.uid
        # the precondition: the apiserver deletes only that Job, never one made in between
        return await self._kube.delete_job(namespace=context.namespace, name=name, uid=uid)
