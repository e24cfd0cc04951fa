"""The periodic backstop: finds and fixes what a missed watch event left behind.

Each pass (leader only) reads in pages, never once per run: the WorkflowRuns are listed in
pages (``limit``/``continue``) and each page is matched against the store in one query
(``store/sweep.py``); only an object that needs something is taken further: one the store
does not hold (its run is created), one being deleted, one whose cancel is not recorded, one
without FlowForge's finalizer, and one whose status shows another phase than the store's
(re-projected). Then the store's active runs are swept in pages, one query each, which
return only the rows that may need a repair: every running attempt has its Job (created when
missing and never created; recorded as lost when it vanished; its outcome recorded when the
Job finished; failed with the Pod's reason when its Pod has not started within
``pendingTimeoutSeconds``), compensators included; released tasks that are due are
dispatched (a queued run's are not: each namespace's queue is served in one locked pass,
which starts what may start and cancels what a ``Replace`` run waits for); runs with nothing
unresolved are settled (which finishes them or starts their
rollback's next compensator: after a restart, that is where a rollback resumes). An active
run whose object is gone is cancelled. Finished Jobs whose outcome is committed are deleted
after the TTL. A run with nothing to repair costs nothing but its row in the sweep, and a
pass that changes nothing patches nothing.

Every LIST is read in pages within a byte budget, each page dropped once read
(``kube/pages.py``), and of each listed Job only a small record is kept for the pass
(``kube/job_record.py``): one tenant's fat Jobs cost one page at a time, never the whole
listing. A pass lists only the Jobs that have not succeeded (``status.successful=0``: running,
pending, suspended by Kueue, failed; ours run one Pod to one completion), so its cost does
not grow with the succeeded Jobs kept (``--job-ttl -1`` keeps them all). A running attempt
whose Job is not among them is read by name (one GET; it has succeeded and its event was
missed, or it is gone). Succeeded Jobs are listed only for the TTL backstop
(``_succeeded_jobs_due``).

The store is swept before Jobs are listed or read, so a Job created concurrently is never
mistaken for a vanished one. A listed or read Job counts only if it is the run's own
(``launcher.py``: same namespace, the recorded uid): a copy is never adopted, read for an
outcome, or deleted. One run's repair failing is logged and counted and the pass goes on
with the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from flowforge.domain.api import FINALIZER
from flowforge.domain.decision import Dispatch, JobRef
from flowforge.domain.execution import job_outcome
from flowforge.domain.observed_job import JobMeaning, job_meaning
from flowforge.domain.run import run_gone, shown_phase
from flowforge.domain.states import TERMINAL_RUN_PHASES, TaskState
from flowforge.kube.job_record import job_record
from flowforge.kube.jobs import LABEL_MANAGED_BY, MANAGED_BY, JobIdentity
from flowforge.kube.pages import pages
from flowforge.operator import metrics
from flowforge.operator.engine import Engine
from flowforge.operator.finalizer import observe_run
from flowforge.operator.launcher import attempt_identity, found_job
from flowforge.operator.runs import RunContext
from flowforge.store.dispatch import JobCreated, record_jobs_created, serve_queue
from flowforge.store.queries import (
    active_tasks,
    oldest_queued_wait,
    recorded_jobs,
    runs_by_phase,
    succeeded_attempts,
)
from flowforge.store.queue import queued_namespaces
from flowforge.store.sweep import ListedRun, SweptTask, listed_runs, sweep_page

# objects per LIST page, and active runs per sweep query
PAGE_SIZE = 500
SWEEP_PAGE_SIZE = 2000
# the apiserver selects Jobs on ``status.successful``, their count of succeeded Pods
UNSUCCEEDED = "status.successful=0"
SUCCEEDED = "status.successful!=0"

logger = logging.getLogger(__name__)


def identity_ref(identity: JobIdentity) -> JobRef:
    return JobRef(identity.task_key, identity.attempt, identity.role)


class Reconciler:
    def __init__(
        self,
        engine: Engine,
        *,
        interval: float,
        page_size: int = PAGE_SIZE,
        sweep_page_size: int = SWEEP_PAGE_SIZE,
    ) -> None:
        self._engine = engine
        self._interval = interval
        self._page_size = page_size
        self._sweep_page_size = sweep_page_size
        self._kick = asyncio.Event()
        self._succeeded_listed_at: float | None = None  # time.monotonic() of the last LIST

    def kick(self) -> None:
        """Run a pass now (e.g. right after this operator became the leader), one that
        lists the succeeded Jobs too: those that finished under another leader have no
        deletion timer in this process."""
        self._succeeded_listed_at = None
        self._kick.set()

    async def run_forever(self) -> None:
        while True:
            await self._engine.leadership.wait_until_leader()
            await self._engine.failures.guard(self.pass_once(), what="a reconciler pass")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=self._interval)
            self._kick.clear()

    def _namespaces(self) -> list[str | None]:
        return list(self._engine.settings.namespaces) or [None]

    async def pass_once(self) -> None:
        engine = self._engine
        seen_uids: set[str] = set()
        for namespace in self._namespaces():
            async for page in pages(
                functools.partial(engine.kube.list_runs, namespace=namespace),
                limit=self._page_size,
            ):
                seen_uids.update(str(body["metadata"]["uid"]) for body in page)
                if await self._observe_page(page):
                    return
        # the store first, then the Jobs: a Job created in between is listed, never "lost"
        sweep = await self._sweep()
        jobs = await self._list_jobs(field_selector=UNSUCCEEDED)
        for run_id, uid in sweep.runs.items():
            if uid in seen_uids and run_id not in sweep.repairs:
                continue
            verdict = await engine.failures.guard(
                self._repair(
                    run_id, listed=uid in seen_uids, rows=sweep.repairs.get(run_id), jobs=jobs
                ),
                what=f"repairing run #{run_id}",
            )
            if verdict.stops:
                return
        if await self._serve_queues():
            return
        await self._clean_up_jobs(jobs | await self._succeeded_jobs_due(), running=sweep.running)
        for phase, count in (await runs_by_phase(engine.pool)).items():
            metrics.RUNS_BY_PHASE.labels(phase).set(count)
        metrics.CACHED_RUNS.set(engine.cached_runs())
        metrics.CACHED_DEFINITION_TASKS.set(engine.runs.definitions.currsize)
        metrics.STATUS_PENDING.set(engine.status.pending())
        metrics.QUEUE_OLDEST_WAIT.set(await oldest_queued_wait(engine.pool))
        metrics.RECONCILE_LAST_PASS.set_to_current_time()

    async def _observe_page(self, page: list[dict[str, Any]]) -> bool:
        """Take further only the listed objects that need something (one store query).
        True: the pass must stop (this operator does not lead any more)."""
        engine = self._engine
        known = await listed_runs(
            engine.pool,
            [
                (str(m["namespace"]), str(m["name"]), str(m["uid"]))
                for m in (body["metadata"] for body in page)
            ],
        )
        for body in page:
            metadata = body["metadata"]
            stored = known.get((str(metadata["namespace"]), str(metadata["uid"])))
            if stored is not None and not _needs_observing(body, stored):
                if shown_phase(body) != stored.phase.value:
                    engine.status.mark(stored.run_id, force=True)
                continue
            verdict = await engine.failures.guard(
                observe_run(engine, body),  # also finishes a deletion left stuck
                what=f"observing run {metadata.get('namespace')}/{metadata.get('name')}",
            )
            if verdict.stops:
                return True
        return False

    async def _serve_queues(self) -> bool:
        """One locked pass over each namespace's queue (a missed hand-off, a Replace run's
        victim, limits raised): never one per queued run, which would hold the namespace's
        lock once per waiting run and stall the hand-offs behind it. True: the pass must
        stop."""
        engine = self._engine
        for namespace in await queued_namespaces(engine.pool):
            verdict = await engine.failures.guard(
                self._serve_queue(namespace), what=f"serving the queue of {namespace}"
            )
            if verdict.stops:
                return True
        return False

    async def _serve_queue(self, namespace: str) -> None:
        engine = self._engine
        decisions = await serve_queue(engine.pool, fence=engine.fence(), namespace=namespace)
        await engine.applier.apply_elsewhere(decisions)

    async def _sweep(self) -> _Sweep:
        sweep = _Sweep()
        after = 0
        while True:
            limit = self._sweep_page_size
            page = await sweep_page(self._engine.pool, after_id=after, limit=limit)
            sweep.add(page.runs, page.tasks, page.settle)
            if page.last_id is None or len(page.runs) < limit:
                return sweep
            after = page.last_id

    async def _succeeded_jobs_due(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The succeeded Jobs, for the TTL backstop alone: none with ``--job-ttl -1``, and a
        LIST at most once per ``max(TTL, interval)`` (and on the first pass, and the first
        after a ``kick``: after a restart or a change of leader no timer is left for them).

        The applier's timers delete each Job when its TTL is over; this catches only what
        they missed, so it may be up to one TTL late (a Job due just after a listing waits
        for the next one): it is deleted within twice the TTL of finishing. In exchange a
        succeeded Job is parsed about once per TTL it exists, not once every pass."""
        ttl = self._engine.settings.job_ttl_seconds
        now = time.monotonic()
        if ttl < 0 or (
            self._succeeded_listed_at is not None
            and now - self._succeeded_listed_at < max(ttl, self._interval)
        ):
            return {}
        self._succeeded_listed_at = now
        return await self._list_jobs(field_selector=SUCCEEDED)

    async def _list_jobs(self, *, field_selector: str) -> dict[tuple[str, str], dict[str, Any]]:
        """The listed Jobs by namespace and name, each as its small record (``job_record``):
        a page is dropped as soon as it is read."""
        jobs: dict[tuple[str, str], dict[str, Any]] = {}
        for namespace in self._namespaces():
            async for page in pages(
                functools.partial(
                    self._engine.kube.list_jobs,
                    namespace=namespace,
                    label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}",
                    field_selector=field_selector,
                ),
                limit=self._page_size,
            ):
                for job in page:
                    metadata = job["metadata"]
                    jobs[(metadata["namespace"], metadata["name"])] = job_record(job)
        return jobs

    async def _repair(
        self,
        run_id: int,
        *,
        listed: bool,
        rows: _Repairs | None,
        jobs: dict[tuple[str, str], dict[str, Any]],
    ) -> None:
        """Cancel an active run whose object the listing did not show and that is gone, or
        repair what its swept rows need."""
        engine = self._engine
        context = await engine.runs.by_id(run_id)
        if not listed and self._watched(context.namespace):
            body = await engine.kube.read_run(namespace=context.namespace, name=context.name)
            if run_gone(body, uid=context.uid):
                metrics.RECONCILE_FIXES.labels("run_deleted").inc()
                await engine.run_gone(context)
                return
        if rows is not None:
            await self._fix_run(context, rows=rows, jobs=jobs)

    def _watched(self, namespace: str) -> bool:
        namespaces = self._engine.settings.namespaces
        return not namespaces or namespace in namespaces

    async def _fix_run(
        self, context: RunContext, *, rows: _Repairs, jobs: dict[tuple[str, str], dict[str, Any]]
    ) -> None:
        engine = self._engine
        released = False
        for row in rows.tasks:
            released = released or row.state == TaskState.READY
            if row.state != TaskState.RUNNING:
                continue
            identity = attempt_identity(context, JobRef(row.task_key, row.attempt, row.role))
            name = identity.name
            job = jobs.get((context.namespace, name))
            if job is None:  # succeeded (only unsucceeded Jobs are listed), or really missing
                job = await engine.kube.read_job(namespace=context.namespace, name=name)
            if job is not None and not engine.launcher.check(
                context, found_job(identity, job), act="adopt", recorded_uid=row.job_uid
            ):
                if not row.job_recorded:
                    continue  # the name is taken by a Job that is not the run's: it waits
                job = None  # the run's Job is gone, a copy has its name
            if job is None and row.job_recorded:
                metrics.RECONCILE_FIXES.labels("job_vanished").inc()
                await engine.vanished(context, identity)
                continue
            if job is None:
                metrics.RECONCILE_FIXES.labels("job_missing").inc()
                await engine.launcher.create(context, Dispatch.of(row))
                continue
            if not row.job_recorded:
                adopted = JobCreated(
                    task_key=row.task_key,
                    attempt=row.attempt,
                    job=name,
                    uid=str(job["metadata"]["uid"]),
                    created=False,
                )
                await record_jobs_created(
                    engine.pool, fence=engine.fence(), run_id=context.run_id, jobs=(adopted,)
                )
            if job_meaning(job) is JobMeaning.FINISHED:
                metrics.RECONCILE_FIXES.labels("outcome_unrecorded").inc()
                await engine.finished(context, found_job(identity, job), job)
            else:  # admitted, evicted, waited too long; a Pod that never started
                await engine.watchdog.check(context, identity_ref(identity), body=job)
        if released:
            await engine.dispatch(context)  # also sets the wake-up for backoffs not over
        if rows.settle:
            await engine.settle(context)

    async def _clean_up_jobs(
        self, jobs: dict[tuple[str, str], dict[str, Any]], *, running: set[tuple[str, str, int]]
    ) -> None:
        """Delete the runs' own Jobs whose attempt is no longer running: unfinished ones at
        once (a cancel whose deletions a crash interrupted), finished ones after the TTL
        (failed ones are listed every pass, succeeded ones by ``_succeeded_jobs_due``). A
        Job that only carries a run's labels is never deleted.

        The sweep's ``running`` (read before the listing) only spares Jobs; a Job is judged
        an orphan only on the run's tasks read after the listing (``_run_jobs``), so a Job
        created after the sweep, whose attempt the sweep did not see running, is kept."""
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
            if outcome is None and (identity.run_uid, identity.task_key, identity.attempt) in (
                running
            ):
                continue  # the Job of a running attempt (the sweep checked it is the run's)
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
            if outcome is None and (identity.task_key, identity.attempt) in run.succeeded:
                continue  # its Pod's success is recorded; the Job completes a moment later
            if outcome is None:
                metrics.RECONCILE_FIXES.labels("orphan_job_stopped").inc()
            await self._engine.kube.delete_job(
                namespace=identity.namespace, name=identity.name, uid=identity.uid
            )

    async def _run_jobs(self, identity: JobIdentity) -> _RunJobs | None:
        context = await self._engine.runs.claimed(identity.run_uid)
        if context is None:
            return None
        rows = await active_tasks(self._engine.pool, context.run_id)
        return _RunJobs(
            context=context,
            running={(row.task_key, row.attempt) for row in rows if row.state == TaskState.RUNNING},
            succeeded=await succeeded_attempts(self._engine.pool, context.run_id),
            recorded=await recorded_jobs(self._engine.pool, context.run_id),
        )


@dataclasses.dataclass(frozen=True)
class _RunJobs:
    """What the cleanup needs of one run: its running attempts and its recorded Jobs."""

    context: RunContext
    running: set[tuple[str, int]]
    succeeded: set[tuple[str, int]]
    recorded: dict[tuple[str, int], str | None]


@dataclasses.dataclass
class _Repairs:
    """What a run's repair looks at: its swept rows, and whether it may settle."""

    tasks: list[SweptTask] = dataclasses.field(default_factory=list)
    settle: bool = False


@dataclasses.dataclass
class _Sweep:
    """The pass's view of the store's active runs: every run's uid, and the few to repair."""

    runs: dict[int, str] = dataclasses.field(default_factory=dict)
    repairs: dict[int, _Repairs] = dataclasses.field(default_factory=dict)
    running: set[tuple[str, str, int]] = dataclasses.field(default_factory=set)

    def add(self, runs: Any, tasks: Any, settle: frozenset[int]) -> None:
        for run in runs:
            self.runs[run.run_id] = run.uid
        for task in tasks:
            self.repairs.setdefault(task.run_id, _Repairs()).tasks.append(task)
            if task.state == TaskState.RUNNING and task.run_id in self.runs:
                self.running.add((self.runs[task.run_id], task.task_key, task.attempt))
        for run_id in settle:
            self.repairs.setdefault(run_id, _Repairs()).settle = True


def _needs_observing(body: Mapping[str, Any], stored: ListedRun) -> bool:
    """Whether a listed object the store holds needs more than a look: it is being deleted,
    its cancel is not recorded yet, or its run is active, has compensators and lacks
    FlowForge's finalizer."""
    metadata = body["metadata"]
    if metadata.get("deletionTimestamp"):
        return True
    if stored.phase in TERMINAL_RUN_PHASES:
        return False
    cancel = bool((body.get("spec") or {}).get("cancel"))
    return (cancel and not stored.cancel_requested) or (
        stored.compensators and FINALIZER not in (metadata.get("finalizers") or [])
    )
