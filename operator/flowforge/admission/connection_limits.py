"""Who may hold a connection to the webhook, and for how long without asking anything.

A connection is admitted after its TLS handshake under two caps: the total and one per
source address, so one client (or one compromised pod) cannot take every slot. An admitted
connection must complete the headers of a request within a deadline, counted from the
handshake for the first request and from the end of the previous one after that; a
connection that holds a slot without doing so (sends nothing, or drips a byte at a time) is
closed. While a request is being served the handler's own timeouts apply.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 128
    # the apiserver is one or a few sources: half the slots leave room for the others
    max_per_source: int = 64
    # the headers of a request, from the handshake or from the previous answer
    header_timeout_seconds: float = 10.0
    # between two requests of one connection (aiohttp's keep-alive closes an idle one too)
    idle_timeout_seconds: float = 30.0


@dataclass
class _Connection:
    source: str
    active: int = 0
    deadline: asyncio.TimerHandle | None = None


@dataclass
class ConnectionGuard:
    """The open connections of one listener, by transport."""

    limits: ConnectionLimits
    _open: dict[asyncio.BaseTransport, _Connection] = field(default_factory=dict)
    _per_source: Counter[str] = field(default_factory=Counter)

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection, or refuse it (the caller closes it) when a cap is full."""
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if (
            len(self._open) >= self.limits.max_connections
            or self._per_source[source] >= self.limits.max_per_source
        ):
            return False
        connection = _Connection(source=source)
        self._open[transport] = connection
        self._per_source[source] += 1
        self._arm(transport, connection, self.limits.header_timeout_seconds)
        return True

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        connection = self._open.get(transport) if transport is not None else None
        if connection is None:
            return
        connection.active += 1
        if connection.deadline is not None:
            connection.deadline.cancel()
            connection.deadline = None

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        connection = self._open.get(transport) if transport is not None else None
        if connection is None:
            return
        connection.active = max(0, connection.active - 1)
        if connection.active == 0:
            seconds = self.limits.idle_timeout_seconds + self.limits.header_timeout_seconds
            self._arm(transport, connection, seconds)  # type: ignore[arg-type]

    def closed(self, transport: asyncio.BaseTransport) -> None:
        connection = self._open.pop(transport, None)
        if connection is None:
            return
        if connection.deadline is not None:
            connection.deadline.cancel()
        self._per_source[connection.source] -= 1
        if self._per_source[connection.source] <= 0:
            del self._per_source[connection.source]

    def open_count(self) -> int:
        return len(self._open)

    def _arm(
        self, transport: asyncio.BaseTransport, connection: _Connection, seconds: float
    ) -> None:
        if connection.deadline is not None:
            connection.deadline.cancel()
        connection.deadline = asyncio.get_running_loop().call_later(
            seconds, self._expire, transport
        )

    def _expire(self, transport: asyncio.BaseTransport) -> None:
        connection = self._open.get(transport)
        if connection is not None and connection.active == 0:
            _abort(transport)


def _abort(transport: asyncio.BaseTransport) -> None:
    """Close at once, dropping anything buffered (a TLS transport is an asyncio.Transport)."""
    if isinstance(transport, asyncio.Transport):
        transport.abort()
    else:
        transport.close()


class GuardedProtocol(asyncio.Protocol):
    """The HTTP protocol of one connection, admitted by the guard and reported to it."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit(transport):
            _abort(transport)
            return
        self._admitted = True
        self._transport = transport
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._admitted:
            self._guard.closed(self._transport)
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()
