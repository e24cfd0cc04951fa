"""The one place where a store decision becomes Kubernetes calls, always in the same order.

Every move of the engine (``flowforge.store``: dispatch, outcome, cancel, settle) returns a
``flowforge.domain.decision.Decision`` once its transaction has committed; ``apply``
performs its effects:

1. stop the Jobs of attempts the move cancelled (their outcome is recorded first, so a
   stopped Job is never mistaken for a lost one), only the run's own (``launcher.py``);
2. post its Events on the WorkflowRun (spawned, so they cost the hot path nothing, and
   posted before the Events of the Jobs it creates: a failure reads before its rollback);
3. create the Jobs of the attempts it dispatched, forward tasks and compensators alike;
4. delete the finished Job whose outcome it recorded, after the TTL, and count the
   outcome and a finished run;
5. re-project the run's status (coalesced with other changes of the run; a queued run whose
   place alone moved, with the queue's other moves);
6. wake the run up when a retry's backoff (or a compensator's) is over: no polling;
7. apply what the same transaction decided for other runs (``Decision.elsewhere``): a queued
   run that the freed slot started, another run's tasks, a run a ``Replace`` cancelled.

Every effect is idempotent, so a crash between the commit and any step is repaired by the
reconciler doing the same again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from flowforge.domain.decision import Decision
from flowforge.operator import metrics
from flowforge.operator.background import Background
from flowforge.operator.kubeport import KubePort
from flowforge.operator.launcher import JobLauncher
from flowforge.operator.notifier import Notifier
from flowforge.operator.runs import RunContext
from flowforge.operator.status import StatusWriter

Wake = Callable[[RunContext], Coroutine[Any, Any, None]]
ContextOf = Callable[[int], Awaitable[RunContext]]


class Applier:
    def __init__(
        self,
        *,
        kube: KubePort,
        launcher: JobLauncher,
        notifier: Notifier,
        status: StatusWriter,
        background: Background,
        job_ttl_seconds: float,
        wake: Wake,
        context_of: ContextOf,
    ) -> None:
        self._kube = kube
        self._launcher = launcher
        self._notifier = notifier
        self._status = status
        self._background = background
        self._job_ttl_seconds = job_ttl_seconds
        self._wake = wake
        self._context_of = context_of

    async def apply(
        self, context: RunContext, decision: Decision, *, received: float | None = None
    ) -> None:
        """Perform what ``decision`` says (nothing for a lost race). ``received``: when the
        event that led to it arrived, for the hand-off latency of the Jobs it creates."""
        if not decision.recorded:
            return
        await self._launcher.delete_all(context, decision.stop_jobs)
        for notice in decision.notices:
            self._notifier.post(context, notice)
        await self._launcher.create_all(context, decision.create_jobs, received=received)
        outcome = decision.outcome
        if outcome is not None:
            metrics.TASK_OUTCOMES.labels(outcome.job.role.value, outcome.reason).inc()
            if not outcome.job_gone and self._job_ttl_seconds >= 0:
                name = context.job_name(
                    task_key=outcome.job.task_key,
                    attempt=outcome.job.attempt,
                    role=outcome.job.role,
                )
                job = outcome.job
                self._background.later(
                    self._job_ttl_seconds,
                    key=(context.run_id, name),
                    coroutine_factory=lambda: self._launcher.delete(context, job),
                )
        if decision.phase is not None and decision.finished:
            metrics.RUNS_FINISHED.labels(decision.phase.value).inc()
        self._status.mark(context.run_id, context=context, queue_moved=decision.queue_moved)
        if decision.wake_at is not None:
            delay = max(0.0, (decision.wake_at - datetime.now(UTC)).total_seconds())
            self._background.later(
                delay + 0.01,
                key=(context.run_id, "wake"),
                earliest=True,
                coroutine_factory=lambda: self._wake(context),
            )
        for other in decision.elsewhere:  # a queued run a freed slot started is a hand-off too
            context = await self._context_of(other.run_id)
            await self.apply(context, other.decision, received=received)
