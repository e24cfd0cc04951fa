"""Answers of the apiserver to a front end's questions about its callers (TokenReviews,
SubjectAccessReviews), remembered briefly.

- One question in flight per key, shared by everyone who asks it meanwhile; it runs as a
  task of its own, so an asker that is cancelled (its client went away) leaves the others
  their answer, and a failure reaches every waiter without being logged as lost.
- Each answer is kept for a time that depends on it (an allow longer than a denial), and
  the answers held weigh at most ``budget`` (each weighs 1 unless ``size`` says otherwise,
  e.g. the bytes it is estimated to hold): the least recently used goes first, never the
  whole cache, so many callers asking at once push out only the answers nobody asked for
  longest. An answer weighing more than the whole budget is handed out and not kept.

The read API also keeps what it derives from immutable rows here (``ttl`` infinite, weighed
in bytes), for the same sharing of work in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class AnswerCache(Generic[K, V]):
    def __init__(
        self,
        *,
        budget: int,
        ttl: Callable[[V], float],
        size: Callable[[V], int] = lambda _: 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._budget = budget
        self._ttl = ttl
        self._size = size
        self._clock = clock
        self._held = 0
        # key -> (answer, until, weight)
        self._answers: OrderedDict[K, tuple[V, float, int]] = OrderedDict()
        self._in_flight: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def held(self) -> int:
        """What the answers kept weigh together (never more than the budget)."""
        return self._held

    def cached(self, key: K) -> V | None:
        """The answer to ``key`` if one is remembered (None also for an answer None)."""
        held = self._fresh(key)
        return None if held is None else held[0]

    async def get(self, key: K, ask: Callable[[], Awaitable[V]]) -> V:
        """The answer to ``key``: remembered, being asked already, or asked now by ``ask``."""
        held = self._fresh(key)
        if held is not None:
            return held[0]
        pending = self._in_flight.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._ask(key, ask))
            pending.add_done_callback(_retrieve)
            self._in_flight[key] = pending
        return await asyncio.shield(pending)

    async def _ask(self, key: K, ask: Callable[[], Awaitable[V]]) -> V:
        try:
            answer = await ask()
        finally:
            self._in_flight.pop(key, None)
        weight = self._size(answer)
        if weight > self._budget:
            return answer
        if key in self._answers:
            self._forget(key)
        self._answers[key] = (answer, self._clock() + self._ttl(answer), weight)
        self._held += weight
        while self._held > self._budget:
            _, (_, _, dropped) = self._answers.popitem(last=False)
            self._held -= dropped
        return answer

    def _fresh(self, key: K) -> tuple[V, float, int] | None:
        held = self._answers.get(key)
        if held is None:
            return None
        if held[1] <= self._clock():
            self._forget(key)
            return None
        self._answers.move_to_end(key)
        return held

    def _forget(self, key: K) -> None:
        self._held -= self._answers.pop(key)[2]


def _retrieve(future: asyncio.Future[Any]) -> None:
    """A question nobody waits for any more still has its failure looked at (no warning)."""
    if not future.cancelled():
        future.exception()
