"""Waiting for a condition, the one way tests do it: ``wait_until`` in a coroutine,
``wait_until_blocking`` outside an event loop (a thread, a synchronous test).

The condition is asked until it answers something true (that answer is returned): at once,
then after 10 ms, each pause twice the last up to ``interval``, so an in-process effect is
seen within milliseconds and a cluster is not asked more than about five times a second.
Past ``timeout`` the test fails naming ``what`` was awaited (a callable is asked then, so it
can tell what was seen last), with the tail of ``operator``'s log where one is given.
Spawned work and timers run when the loop lets them, so a test waits for their effect
(generously) rather than for a fixed time.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

FIRST_PAUSE_SECONDS = 0.01


class Logged(Protocol):
    """A process whose log tells why it did not get there (``OperatorProcess``)."""

    def log_tail(self, lines: int = 40) -> str: ...


def _pauses(interval: float) -> Iterator[float]:
    pause = min(FIRST_PAUSE_SECONDS, interval)
    while True:
        yield pause
        pause = min(pause * 2, interval)


Awaited = str | Callable[[], str]


def _timed_out(what: Awaited, timeout: float, operator: Logged | None) -> AssertionError:
    awaited = what() if callable(what) else what
    tail = f"\n{operator.log_tail()}" if operator is not None else ""
    return AssertionError(f"not within {timeout:g} s: {awaited}{tail}")


async def wait_until(
    condition: Callable[[], Any | Awaitable[Any]],
    *,
    what: Awaited,
    timeout: float = 10.0,
    interval: float = 0.2,
    operator: Logged | None = None,
) -> Any:
    """The first true answer of ``condition()`` (a value, or an awaitable of one)."""
    try:
        async with asyncio.timeout(timeout):
            for pause in _pauses(interval):
                answer = condition()
                if inspect.isawaitable(answer):
                    answer = await answer
                if answer:
                    return answer
                await asyncio.sleep(pause)
    except TimeoutError:
        raise _timed_out(what, timeout, operator) from None


def wait_until_blocking(
    condition: Callable[[], Any],
    *,
    what: Awaited,
    timeout: float,
    interval: float = 0.2,
    operator: Logged | None = None,
) -> Any:
    """``wait_until`` for code outside an event loop: sleeps the thread between asks."""
    deadline = time.monotonic() + timeout
    for pause in _pauses(interval):
        answer = condition()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, operator)
        time.sleep(pause)
    raise AssertionError("unreachable: the pauses never end")
