"""Job creations the apiserver could not take now, and when each is tried again.

A refusal is transient when sending the same Job later may succeed: 429, 5xx, no answer,
and a ResourceQuota that is full (403 Forbidden with ``exceeded quota``: it frees when other
Pods or Jobs finish). Any other refusal (422 invalid, 403 from Pod Security or another
admission policy) is final: the attempt fails with the apiserver's message.

A delayed attempt stays running with no Job; it is tried again after a backoff that doubles
up to a cap, from a timer, never by waiting in an event handler, and its message is shown in
the run's status and, a few times an hour at most, as a ``JobCreationDelayed`` Warning.
Nothing here is the system of record: after a restart the reconciler creates the Job again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flowforge.domain.execution import BackoffPolicy, retry_delay
from flowforge.kube.errors import KubernetesError

# a delayed attempt gets a Warning Event on its first delay, then at most one per interval
DELAY_NOTICE_INTERVAL_SECONDS = 300.0

AttemptKey = tuple[int, str, int]  # (run id, task key, attempt)


def quota_exceeded(error: KubernetesError) -> bool:
    """A ResourceQuota refused the object: the apiserver answers 403 ``exceeded quota``."""
    return error.status == 403 and "exceeded quota" in error.message


def transient(error: KubernetesError) -> bool:
    """Whether creating the same Job again later may succeed."""
    return error.retryable or quota_exceeded(error)


@dataclass
class _Delay:
    tries: int
    message: str
    noticed_at: float


class CreationDelays:
    """Per delayed attempt: how many creations failed, the last message, the last notice."""

    def __init__(
        self, *, policy: BackoffPolicy, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._delays: dict[AttemptKey, _Delay] = {}

    def delayed(self, key: AttemptKey, message: str) -> tuple[float, bool]:
        """Another creation of the attempt failed with ``message``: the seconds to wait before
        the next try, and whether to post a Warning Event about it."""
        now = self._clock()
        delay = self._delays.get(key)
        notify = delay is None or now - delay.noticed_at >= DELAY_NOTICE_INTERVAL_SECONDS
        tries = 1 if delay is None else delay.tries + 1
        noticed_at = now if notify or delay is None else delay.noticed_at
        self._delays[key] = _Delay(tries=tries, message=message, noticed_at=noticed_at)
        wait = retry_delay(failed_attempts=tries, policy=self._policy, unit=0.0)
        return wait.total_seconds(), notify

    def cleared(self, key: AttemptKey) -> None:
        """The attempt's Job exists, or the attempt is over."""
        self._delays.pop(key, None)

    def messages(self, run_id: int) -> dict[tuple[str, int], str]:
        """(task key, attempt) -> why the attempt's Job does not exist yet, for the run."""
        return {
            (task_key, attempt): f"Job creation delayed ({delay.tries} tries): {delay.message}"
            for (run, task_key, attempt), delay in self._delays.items()
            if run == run_id
        }

    def forget_run(self, run_id: int) -> None:
        for key in [key for key in self._delays if key[0] == run_id]:
            del self._delays[key]

    def runs(self) -> int:
        """How many runs have a delayed attempt."""
        return len({run_id for run_id, _, _ in self._delays})
