"""The rate of Job creations, shared fairly between namespaces.

kopf has no client-side rate limiter, and a 10,000-task fan-out must not flood the
apiserver, so every Job creation first takes a token of a bucket (``rate`` a second on
average, bursts up to ``burst``). A creation that finds no token waits in its namespace's
line, and the lines are served in turn (``domain/turns.py``): one tenant's fan-out (or its
many runs' roots) delays another namespace's next Job by at most one creation per namespace
with one waiting, not by the whole backlog (with one line for all, 10,000 roots at 50 a
second held every other tenant's next Job about 200 s).

Waiting is a future resolved from a timer of the engine's clock (a test's fake one moves
only when told); one timer is pending at most, whatever the backlog. A creation whose
waiter was cancelled (shutdown, a handler cancelled) gives its turn to the next one.
"""

from __future__ import annotations

import asyncio

from flowforge.domain.turns import Turns
from flowforge.operator.background import Clock, TimerHandle

# a token counts as whole within this much (timers fire at float instants)
_EPSILON = 1e-9


class CreationTurns:
    """Hands out Job creations at ``rate`` a second (bursts up to ``burst``), round-robin
    between the namespaces waiting; ``rate`` 0 (or less) never waits."""

    def __init__(self, *, rate: float, burst: int, clock: Clock | None = None) -> None:
        self._rate = rate
        self._capacity = float(max(1, burst))
        self._tokens = self._capacity
        self._clock = clock
        self._updated: float | None = None
        self._waiting: Turns[str, asyncio.Future[None]] = Turns()
        self._timer: TimerHandle | None = None

    async def take(self, namespace: str) -> None:
        """Wait until a Job of ``namespace`` may be created (its turn, and a token)."""
        if self._rate <= 0:
            return
        self._refill()
        if not self._waiting and self._tokens >= 1.0 - _EPSILON:
            self._tokens -= 1.0
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.add(namespace, turn)
        self._wake_later()
        await turn

    def _now(self) -> float:
        return (self._clock or asyncio.get_running_loop()).time()

    def _refill(self) -> None:
        now = self._now()
        if self._updated is not None:
            self._tokens = min(self._capacity, self._tokens + (now - self._updated) * self._rate)
        self._updated = now

    def _wake_later(self) -> None:
        if self._timer is not None or not self._waiting:
            return
        due = self._now() + max(0.0, 1.0 - self._tokens) / self._rate
        self._timer = (self._clock or asyncio.get_running_loop()).call_at(due, self._serve)

    def _serve(self) -> None:
        """A token is due: give each whole one to the next waiter in turn."""
        self._timer = None
        self._refill()
        while self._tokens >= 1.0 - _EPSILON:
            taken = self._waiting.take()
            if taken is None:
                break
            turn = taken[1]
            if not turn.done():  # a cancelled waiter's turn goes to the next one
                turn.set_result(None)
                self._tokens -= 1.0
        self._wake_later()
