"""What one client may hold of the server: live streams, idle connections and the event loop.

- Stream slots are taken before any await of the stream's request (so concurrent requests
  cannot all pass the check before one counts), at most ``total`` at once and ``per_user``
  for one user; a slot is released exactly once, however the stream ends.
- ``HeaderDeadlineH11Protocol`` is uvicorn's h11 protocol with a deadline on the headers of
  each request, counted from the connection or from the previous answer: a connection that
  sends nothing, or drips bytes, is closed instead of holding one of the server's
  connections (uvicorn answers 503 to everyone once they are all held).
- ``OffLoop`` runs what is CPU-heavy on threads, so one large request does not stop the
  event loop from answering every other.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from flowforge.server.errors import ApiError

HEADER_TIMEOUT_SECONDS: Final = 10.0
# the machine's share for parsing and serialising: more would only queue on the GIL
HEAVY_THREADS: Final = 2

T = TypeVar("T")


@dataclass
class StreamSlot:
    _slots: StreamSlots
    user: str
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._slots._release(self.user)


@dataclass
class StreamSlots:
    total: int = 64
    per_user: int = 8
    _open: Counter[str] = field(default_factory=Counter)

    @property
    def open(self) -> int:
        return sum(self._open.values())

    def take(self, user: str) -> StreamSlot:
        """A slot for ``user``'s stream, or a 503 naming the bound that is full. Synchronous:
        the check and the count happen with no await between them."""
        if self.open >= self.total:
            raise ApiError(503, f"this server already serves {self.total} streams; try later")
        if self._open[user] >= self.per_user:
            raise ApiError(
                503, f"{user} already has {self.per_user} live streams open; close one first"
            )
        self._open[user] += 1
        return StreamSlot(self, user)

    def _release(self, user: str) -> None:
        self._open[user] -= 1
        if self._open[user] <= 0:
            del self._open[user]


class HeaderDeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol; each request's headers must arrive within the deadline."""

    header_timeout_seconds: float = HEADER_TIMEOUT_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self._disarm_header_deadline()  # headers read: the request's own timeouts apply

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle  # a pipelined request may already have started
        waiting = cycle is None or cycle.response_complete
        if waiting and not self.transport.is_closing():
            self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(
            self.header_timeout_seconds, self._header_deadline_passed
        )

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.transport.abort()


class OffLoop:
    """CPU-heavy work (parsing a large definition, serialising its graphs) on threads of
    its own, at most ``threads`` at once, so the event loop keeps answering meanwhile
    (``/healthz`` included: a 10,000-task definition takes about a second to parse)."""

    def __init__(self, threads: int = HEAVY_THREADS) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="heavy")

    async def run(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
