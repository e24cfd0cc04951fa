"""The namespace's FlowForgePolicy as it is now, judged again before each Job is created.

Admission checks a run against the policy once, when it is created; a run may then wait in
a queue, retry, or roll back long after an admin tightened the policy. So before each Job
(forward attempts, retries and compensators alike) the launcher asks ``refusal``: the
domain's ``job_refusal`` (the check admission runs for each task type) against the
namespace's policies as the operator's watch of FlowForgePolicy objects last delivered them
(``update``, from ``Engine.policy_changed``). A namespace not seen yet is read at once; an
entry read under another leadership epoch (this process was not the leader, so it skipped
the watch's events) or older than ``MAX_AGE_SECONDS`` (a missed event) is read again.
Concurrent readers of one namespace share one LIST, and a copy judges each task type of a
definition (by fingerprint) once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from flowforge.domain.policy import Policy, job_refusal, read_policies
from flowforge.operator.kubeport import KubePort
from flowforge.operator.runs import RunContext

# a policy change is seen through the watch at once; this bounds how long a missed event
# could leave a loosened copy in force
MAX_AGE_SECONDS: Final = 60.0
# namespaces remembered (beyond it the oldest are read again)
_REMEMBERED_NAMESPACES: Final = 10_000
# verdicts remembered per namespace's copy (beyond it they are judged afresh)
_REMEMBERED_VERDICTS: Final = 1_000


@dataclass(frozen=True)
class _Seen:
    policies: list[Policy]
    problems: list[str]
    epoch: int
    at: float
    # (definition fingerprint, task type) -> the verdict: a fan-out's Jobs of one task type
    # are judged once per copy of the policies
    verdicts: dict[tuple[str, str], str | None] = field(default_factory=dict)


class NamespacePolicies:
    def __init__(
        self,
        kube: KubePort,
        *,
        epoch: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._epoch = epoch
        self._clock = clock
        self._seen: dict[str, _Seen] = {}  # insertion-ordered, the oldest forgotten first
        self._reading: dict[str, asyncio.Future[_Seen]] = {}

    def update(self, namespace: str, objects: Sequence[Mapping[str, Any]]) -> list[Policy]:
        """The namespace's FlowForgePolicy objects as just read; the readable ones."""
        policies, problems = read_policies(objects, namespace=namespace)
        self._remember(namespace, policies=policies, problems=problems)
        return policies

    async def refusal(self, context: RunContext, type_name: str) -> str | None:
        """Why the namespace's policies refuse a Job of the run's task type now (None: they
        allow it)."""
        seen = await self._current(context.namespace)
        key = (context.definition.fingerprint, type_name)
        if key not in seen.verdicts:
            if len(seen.verdicts) >= _REMEMBERED_VERDICTS:
                seen.verdicts.clear()
            seen.verdicts[key] = job_refusal(
                context.definition.spec,
                type_name,
                namespace=context.namespace,
                policies=seen.policies,
                problems=seen.problems,
            )
        return seen.verdicts[key]

    async def _current(self, namespace: str) -> _Seen:
        seen = self._seen.get(namespace)
        if (
            seen is not None
            and seen.epoch == self._epoch()
            and self._clock() - seen.at < MAX_AGE_SECONDS
        ):
            return seen
        reading = self._reading.get(namespace)
        if reading is None:
            reading = asyncio.ensure_future(self._read(namespace))
            self._reading[namespace] = reading
            reading.add_done_callback(lambda _: self._reading.pop(namespace, None))
        # one waiter cancelled does not cancel the read the others wait for
        return await asyncio.shield(reading)

    async def _read(self, namespace: str) -> _Seen:
        objects = await self._kube.list_policies(namespace=namespace)
        policies, problems = read_policies(objects, namespace=namespace)
        return self._remember(namespace, policies=policies, problems=problems)

    def _remember(self, namespace: str, *, policies: list[Policy], problems: list[str]) -> _Seen:
        seen = _Seen(policies=policies, problems=problems, epoch=self._epoch(), at=self._clock())
        self._seen.pop(namespace, None)
        self._seen[namespace] = seen
        while len(self._seen) > _REMEMBERED_NAMESPACES:
            del self._seen[next(iter(self._seen))]
        return seen
