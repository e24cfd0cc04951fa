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
7. forget what the process kept of a run that finished (the engine's ``finished`` hook);
8. apply what the same transaction decided for other runs (``Decision.elsewhere``): a queued
   run that the freed slot started, another run's tasks, a run a ``Replace`` cancelled,
   each with its own context (``apply_elsewhere``, also what a queue pass or a policy
   change decided).

Deferred effects (the TTL delete, the wake-up) are keys (``background.Deferred``): the
run's context is looked up again when they are due, never captured here.

Every effect is idempotent, so a crash between the commit and any step is repaired by the
reconciler doing the same again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flowforge.domain.decision import Decision, RunDecision
from flowforge.operator import metrics, tracing
from flowforge.operator.background import Background, Deferred, Purpose
from flowforge.operator.kubeport import KubePort
from flowforge.operator.launcher import JobLauncher
from flowforge.operator.notifier import Notifier
from flowforge.operator.runs import RunCache, RunContext
from flowforge.operator.status import StatusWriter


class Applier:
    def __init__(
        self,
        *,
        kube: KubePort,
        launcher: JobLauncher,
        notifier: Notifier,
        status: StatusWriter,
        background: Background,
        job_ttl_seconds: Callable[[], float],
        runs: RunCache,
    ) -> None:
        self._kube = kube
        self._launcher = launcher
        self._notifier = notifier
        self._status = status
        self._background = background
        self._job_ttl_seconds = job_ttl_seconds
        self._runs = runs

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
            ttl = self._job_ttl_seconds()
            if not outcome.job_gone and ttl >= 0:
                self._background.later(
                    ttl,
                    Deferred(context.run_id, Purpose.DELETE_JOB, job=outcome.job),
                )
        if decision.phase is not None and decision.finished:
            metrics.RUNS_FINISHED.labels(decision.phase.value).inc()
        self._status.mark(context.run_id, context=context, queue_moved=decision.queue_moved)
        if decision.wake_in is not None:
            self._background.later(
                decision.wake_in + 0.01, Deferred(context.run_id, Purpose.WAKE), earliest=True
            )
        if decision.phase is not None and decision.finished:
            tracing.run_finished(context, decision.phase)
            self.forget(context)
            self._runs.finished(run_id=context.run_id, uid=context.uid, phase=decision.phase)
        # a queued run a freed slot started is a hand-off too
        await self.apply_elsewhere(decision.elsewhere, received=received)

    def forget(self, context: RunContext) -> None:
        """The run finished (or is gone): drop everything this process kept about it (its
        final status patch, already marked, still goes out)."""
        self._runs.forget(context)
        self._launcher.forget(context)
        self._notifier.forget_run(context)

    async def apply_elsewhere(
        self, decisions: Sequence[RunDecision], *, received: float | None = None
    ) -> None:
        """Apply what one transaction decided for other runs, each with its own context."""
        for other in decisions:
            await self.apply(
                await self._runs.by_id(other.run_id), other.decision, received=received
            )
