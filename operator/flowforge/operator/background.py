"""Fire-and-forget work and timers of the engine, with their failures logged, not lost.

Nothing here is the system of record: a spawned Event post or a timer that dies with the
process is redone by the reconciler (a due retry is dispatched, a status re-projected).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from flowforge.domain.errors import InfrastructureError
from flowforge.store.errors import StaleEpochError

logger = logging.getLogger(__name__)


class NotLeaderError(InfrastructureError):
    """This operator does not hold the lease: it must not act."""


class Background:
    def __init__(self, *, on_deposed: Callable[[], Awaitable[None]]) -> None:
        self._on_deposed = on_deposed
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: dict[tuple[int, str], asyncio.TimerHandle] = {}

    def spawn(self, coroutine: Coroutine[Any, Any, Any], *, what: str) -> None:
        task = asyncio.get_running_loop().create_task(self._logged(coroutine, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def later(
        self,
        delay: float,
        *,
        key: tuple[int, str],
        coroutine_factory: Callable[[], Coroutine[Any, Any, Any]],
        earliest: bool = False,
    ) -> None:
        """Run ``coroutine_factory()`` after ``delay`` seconds; a later call with the same
        key replaces the pending one (one wake-up per run and purpose). With ``earliest``
        a pending one that fires sooner is kept instead (whoever it wakes finds the later
        work and asks again)."""
        loop = asyncio.get_running_loop()
        previous = self._timers.get(key)
        if previous is not None:
            if earliest and previous.when() <= loop.time() + delay:
                return
            previous.cancel()
            del self._timers[key]

        def fire() -> None:
            self._timers.pop(key, None)
            self.spawn(coroutine_factory(), what=f"timer {key}")

        self._timers[key] = loop.call_later(delay, fire)

    def cancel(self, key: tuple[int, str]) -> None:
        """Drop the pending timer with ``key``, if there is one."""
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle.cancel()

    def shutdown(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        for task in list(self._tasks):
            task.cancel()

    async def _logged(self, coroutine: Awaitable[Any], what: str) -> None:
        try:
            await coroutine
        except (NotLeaderError, asyncio.CancelledError):
            pass
        except StaleEpochError as error:
            logger.error("%s refused, deposed: %s", what, error)
            await self._on_deposed()
        except Exception:
            logger.exception("%s failed; the reconciler will retry", what)
