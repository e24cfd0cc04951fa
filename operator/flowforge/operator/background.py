"""Fire-and-forget work and deferred work of the engine, with their failures handled in one
place (``failures.py``), not lost.

Deferred work is a key, never a closure: ``later`` stores a ``Deferred`` (which run, what
to do, for which attempt) and, when it is due, hands the key to the engine, which builds the
run's *current* context from the run id (as controller-runtime's ``RequeueAfter`` hands a
reconciler a name, not an object). A closure over a context would act on whatever the
captured variable holds when it fires: a TTL delete once went to another run that way.

Nothing here is the system of record: a spawned Event post or a timer that dies with the
process is redone by the reconciler (a due retry is dispatched, a status re-projected).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from flowforge.domain.decision import JobRef
from flowforge.operator.failures import Failures


class Purpose(enum.StrEnum):
    """What a deferred key asks for when it is due."""

    WAKE = "wake"  # a retry's (or the next compensator's) backoff is over: dispatch, settle
    DELETE_JOB = "delete-job"  # a finished Job's TTL is over
    WATCH_JOB = "watch-job"  # an attempt's pending or admission timeout may be over
    CREATE_JOB = "create-job"  # the apiserver delayed a Job's creation: try again
    WRITE_EVENTS = "write-events"  # a run's folded Events of one reason are due


@dataclasses.dataclass(frozen=True)
class Deferred:
    """One piece of deferred work: the run, what, and for which attempt (or Event reason).
    At most one is pending per key."""

    run_id: int
    purpose: Purpose
    job: JobRef | None = None
    reason: str = ""


class TimerHandle(Protocol):
    def cancel(self) -> None: ...
    def when(self) -> float: ...


class Clock(Protocol):
    """When deferred work is due: the event loop (``loop.time``/``loop.call_at``), or a
    test's fake clock that moves only when told."""

    def time(self) -> float: ...
    def call_at(self, when: float, callback: Callable[[], object]) -> TimerHandle: ...


Fire = Callable[[Deferred], Coroutine[Any, Any, None]]


class Background:
    def __init__(self, *, failures: Failures, fire: Fire, clock: Clock | None = None) -> None:
        self._failures = failures
        self._fire = fire
        self._clock = clock
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: dict[Deferred, TimerHandle] = {}

    def spawn(self, coroutine: Coroutine[Any, Any, Any], *, what: str) -> None:
        task = asyncio.get_running_loop().create_task(self._failures.guard(coroutine, what=what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def later(self, delay: float, key: Deferred, *, earliest: bool = False) -> None:
        """Hand ``key`` to the engine after ``delay`` seconds; a later call with the same
        key replaces the pending one. With ``earliest`` a pending one that fires sooner is
        kept instead (whoever it wakes finds the later work and asks again)."""
        clock = self._clock or asyncio.get_running_loop()
        due = clock.time() + max(0.0, delay)
        previous = self._timers.get(key)
        if previous is not None:
            if earliest and previous.when() <= due:
                return
            previous.cancel()
            del self._timers[key]

        def fire() -> None:
            self._timers.pop(key, None)
            self.spawn(self._fire(key), what=f"{key.purpose} of run #{key.run_id}")

        self._timers[key] = clock.call_at(due, fire)

    def cancel(self, key: Deferred) -> None:
        """Drop the pending work with ``key``, if there is any."""
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle.cancel()

    def pending(self) -> int:
        return len(self._timers)

    def shutdown(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
