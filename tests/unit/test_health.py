"""The probes: liveness follows the loop's heartbeat, readiness the database's last answer."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

from flowforge.operator.health import Health, heartbeat, serve
from tests.support.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_once_the_heartbeat_is_older_than_the_stall_limit() -> None:
    clock = Clock()
    health = Health(stall_seconds=5.0, clock=clock)
    assert health.live() == (True, "ok")
    clock.now += 5.0
    assert health.live()[0]
    clock.now += 0.1
    ok, text = health.live()
    assert not ok and "5.1 s" in text
    health.beat()
    assert health.live()[0]


def test_readiness_needs_a_recent_database_answer() -> None:
    clock = Clock()
    health = Health(stall_seconds=5.0, ready_for=3.0, clock=clock)
    assert health.ready() == (False, "database not reached yet")
    health.database_answered()
    assert health.ready()[0]
    clock.now += 3.5
    ok, text = health.ready()
    assert not ok and "unreachable" in text


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


async def test_a_blocked_event_loop_turns_healthz_red_while_the_thread_still_answers() -> None:
    health = Health(stall_seconds=0.5)
    server = serve(health, host="127.0.0.1", port=0)
    port = server.server_address[1]
    beating = asyncio.create_task(heartbeat(health, beat_seconds=0.1))
    try:
        await asyncio.sleep(0.2)
        assert await asyncio.to_thread(_status, port, "/healthz") == 200
        assert await asyncio.to_thread(_status, port, "/readyz") == 503
        time.sleep(1.0)  # wedge the loop: no heartbeat
        assert _status(port, "/healthz") == 503

        # the loop runs again: the next heartbeat turns it green (however slow the machine)
        async def green() -> bool:
            return await asyncio.to_thread(_status, port, "/healthz") == 200

        await wait_until(green, timeout=10, what="/healthz green once the loop runs again")
        assert await asyncio.to_thread(_status, port, "/nothing") == 404
    finally:
        beating.cancel()
        server.shutdown()
