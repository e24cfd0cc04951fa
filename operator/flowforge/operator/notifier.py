"""Posting Kubernetes Events on a WorkflowRun without holding up the hot path.

Events are for people (``kubectl describe wfr``); the store's history is the record. A
post is fire-and-forget on the engine's background work, its failure logged. On a big run
similar Events fold into one Event that counts them (``domain/event_series.py``), written
at most once per ``SERIES_FLUSH_SECONDS`` per run and reason. A single-task run's
``RunStarted`` tells its Job's start too (``announce``), which then has no Event of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from flowforge.domain.decision import Notice
from flowforge.domain.event_series import EventCorrelator
from flowforge.kube.events import RunEvent, series_name
from flowforge.operator import metrics
from flowforge.operator.background import Background, Deferred, Purpose
from flowforge.operator.kubeport import KubePort
from flowforge.operator.runs import RunContext

SERIES_FLUSH_SECONDS = 5.0


class Notifier:
    def __init__(
        self,
        *,
        kube: KubePort,
        background: Background,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._background = background
        self._clock = clock
        self._correlator = EventCorrelator()
        self._announced: dict[str, str] = {}  # run uid -> the Job whose start was told

    def post(self, context: RunContext, notice: Notice) -> None:
        metrics.NOTICES.labels(notice.reason).inc()
        alone = self._correlator.observe(
            run_uid=context.uid,
            reason=notice.reason,
            warning=notice.warning,
            message=notice.message,
            now=self._clock(),
        )
        if not alone:
            self._background.later(
                SERIES_FLUSH_SECONDS,
                Deferred(context.run_id, Purpose.WRITE_EVENTS, reason=notice.reason),
                earliest=True,
            )
            return
        self._background.spawn(
            self._kube.post_run_event(
                RunEvent(context.namespace, context.name, context.uid, notice)
            ),
            what="event",
        )

    def announce(self, context: RunContext, notice: Notice, *, job: str) -> None:
        """Post ``notice``, which tells that ``job`` starts: its ``started`` is then False."""
        self._announced[context.uid] = job
        self.post(context, notice)

    def started(self, context: RunContext, *, job: str) -> bool:
        """Whether the start of the run's ``job`` is still to be told."""
        if self._announced.get(context.uid) != job:
            return True
        del self._announced[context.uid]
        return False

    async def flush_series(self, context: RunContext, reason: str) -> None:
        """Write what the run's series Event of ``reason`` has folded since it was written."""
        update = self._correlator.pending(run_uid=context.uid, reason=reason)
        if update is None:
            return
        event = RunEvent(
            context.namespace, context.name, context.uid, Notice(reason, update.message)
        )
        await self._kube.write_run_event_series(
            event,
            name=series_name(event, suffix=update.name_suffix),
            count=update.count,
            exists=update.exists,
        )
        self._correlator.written(run_uid=context.uid, update=update)

    def forget_run(self, context: RunContext) -> None:
        """The run finished: its Event counts go once their series Events are written."""
        self._correlator.forget_run(context.uid)
        self._announced.pop(context.uid, None)

    def __len__(self) -> int:
        """How many (run, reason) Event counts and told Job starts are kept."""
        return len(self._correlator) + len(self._announced)
