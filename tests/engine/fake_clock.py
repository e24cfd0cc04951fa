"""A clock for the engine's deferred work that moves only when a test says so
(``flowforge.operator.background.Clock``): a TTL of 300 s is tested without waiting 300 s
and without switching the TTL off."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass
class FakeTimer:
    due: float
    callback: Callable[[], object]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True

    def when(self) -> float:
        return self.due


class FakeClock:
    def __init__(self) -> None:
        self._now = 1000.0
        self._timers: list[FakeTimer] = []

    def time(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> FakeTimer:
        timer = FakeTimer(due=when, callback=callback)
        self._timers.append(timer)
        return timer

    def pending(self) -> list[float]:
        """When each timer still waiting is due, in seconds from now."""
        return sorted(t.due - self._now for t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> int:
        """Move time on and fire what fell due, earliest first; how many fired (their work
        is spawned on the event loop: wait for its effect)."""
        self._now += seconds
        due = sorted((t for t in self._timers if t.due <= self._now), key=lambda t: t.due)
        for timer in due:
            self._timers.remove(timer)
        fired = [timer for timer in due if not timer.cancelled]
        for timer in fired:
            timer.callback()
        return len(fired)
