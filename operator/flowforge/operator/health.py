"""``/healthz`` (liveness) and ``/readyz`` (readiness), served by a thread on 127.0.0.1.

The server is a thread so that it answers while the event loop is busy, which is exactly
why it must not report the thread's own health: a task in the loop stamps a heartbeat every
``beat_seconds``, and ``/healthz`` fails once that stamp is older than ``stall_seconds`` (the
loop is blocked or starved). ``/readyz`` is true while the database answered a ``SELECT 1``
(on a connection of its own, with a short bound) within the last few seconds; the check runs
in the loop once a second and the thread only reads its result.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from flowforge.operator import metrics
from flowforge.store.session import SessionLimits
from flowforge.store.single import SingleConnection

logger = logging.getLogger(__name__)

READINESS_LIMITS = SessionLimits(
    connect_timeout_seconds=1,
    statement_timeout_seconds=1.0,
    lock_timeout_seconds=1.0,
    idle_in_transaction_seconds=5.0,
)


class Health:
    """What the probes report; the loop writes it, the HTTP thread reads it."""

    def __init__(
        self,
        *,
        stall_seconds: float,
        ready_for: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stall_seconds = stall_seconds
        self._ready_for = ready_for
        self._clock = clock
        self._beat = clock()
        self._database_ok_at: float | None = None

    def beat(self) -> None:
        self._beat = self._clock()

    def database_answered(self) -> None:
        self._database_ok_at = self._clock()

    def live(self) -> tuple[bool, str]:
        late = self._clock() - self._beat
        if late > self._stall_seconds:
            return False, f"event loop blocked: last heartbeat {late:.1f} s ago"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self._database_ok_at is None:
            return False, "database not reached yet"
        late = self._clock() - self._database_ok_at
        if late > self._ready_for:
            return False, f"database unreachable: last answer {late:.1f} s ago"
        return True, "ok"


async def heartbeat(health: Health, *, beat_seconds: float = 1.0) -> None:
    while True:
        health.beat()
        await asyncio.sleep(beat_seconds)


async def check_database(health: Health, dsn: str, *, every: float = 1.0) -> None:
    connection = SingleConnection(dsn, limits=READINESS_LIMITS, name="flowforge-readiness")
    try:
        while True:
            try:
                await connection.run(lambda c: c.execute("SELECT 1"))
                health.database_answered()
                metrics.STORE_UP.set(1)
            except Exception as error:
                metrics.STORE_UP.set(0)
                logger.debug("readiness: database check failed: %s", error)
            await asyncio.sleep(every)
    finally:
        await connection.close()


def serve(health: Health, *, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            checks = {"/healthz": health.live, "/readyz": health.ready}
            check = checks.get(self.path)
            ok, text = (False, "not found") if check is None else check()
            body = (text + "\n").encode()
            self.send_response(404 if check is None else (200 if ok else 503))
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="flowforge-health", daemon=True).start()
    return server
