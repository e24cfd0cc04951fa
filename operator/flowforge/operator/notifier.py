"""Posting Kubernetes Events on a WorkflowRun without holding up the hot path.

Events are for people (``kubectl describe wfr``); the store's history is the record. A
post is fire-and-forget on the engine's background work, its failure logged.
"""

from __future__ import annotations

from flowforge.domain.decision import Notice
from flowforge.operator.background import Background
from flowforge.operator.kubeport import KubePort
from flowforge.operator.runs import RunContext


class Notifier:
    def __init__(self, *, kube: KubePort, background: Background) -> None:
        self._kube = kube
        self._background = background

    def post(self, context: RunContext, notice: Notice) -> None:
        self._background.spawn(
            self._kube.post_run_event(
                namespace=context.namespace,
                run_name=context.name,
                run_uid=context.uid,
                reason=notice.reason,
                message=notice.message,
                warning=notice.warning,
            ),
            what="event",
        )
