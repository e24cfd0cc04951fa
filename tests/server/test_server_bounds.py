"""What one client can hold of the read API, tried the attacker's way against the real
application under uvicorn on 127.0.0.1 (no cluster: every attack here is refused before a
token is looked at, or is about connections):

- idle and dripping connections that never finish their headers are closed, so they do not
  hold every connection (uvicorn then answers 503 to everyone);
- the probes answer on a port of their own while the API's port is full;
- a cross-site ``text/plain`` POST is refused, the UI's header or a JSON body gets through;
- stream slots are counted before any await, in total and per user.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import pytest

from flowforge.server.errors import ApiError
from flowforge.server.limits import HeaderDeadlineH11Protocol, StreamSlots
from tests.support.served_api import Served, ask, get, serving

CONNECTIONS = 8
HEADER_TIMEOUT = 0.5


class QuickDeadline(HeaderDeadlineH11Protocol):
    header_timeout_seconds = HEADER_TIMEOUT


class _NobodyAuthenticates:
    async def caller(self, authorization: str | None) -> Any:
        raise ApiError(401, "no token")


@dataclass
class _State:
    authenticator: _NobodyAuthenticates


async def _state() -> Any:
    return _State(authenticator=_NobodyAuthenticates())


def _serving(protocol: type[asyncio.Protocol]) -> contextlib.AbstractAsyncContextManager[Served]:
    return serving(_state, protocol=protocol, connections=CONNECTIONS)


async def _hold(port: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """Every connection the server allows: half silent, half dripping a header line."""
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CONNECTIONS)]
    for _, writer in held[1::2]:
        writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    await asyncio.sleep(0.1)  # the server has accepted them all
    return held


async def _drip(held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    while True:
        for _, writer in held[1::2]:
            if not writer.is_closing():
                with contextlib.suppress(ConnectionError):
                    writer.write(b"x")
        await asyncio.sleep(0.1)


async def test_connections_that_never_finish_their_headers_are_closed() -> None:
    async with _serving(QuickDeadline) as served:
        held = await _hold(served.port)
        dripper = asyncio.ensure_future(_drip(held))
        try:
            # while they are held, uvicorn answers 503 to everyone; then they are closed
            deadline = time.monotonic() + 10 * HEADER_TIMEOUT + 5
            while (status := (await ask(served.port, get("/healthz")))[0]) != 200:
                assert status == 503
                assert time.monotonic() < deadline, "the idle connections were never closed"
                await asyncio.sleep(0.1)
            for reader, _ in held:
                assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        finally:
            dripper.cancel()
            for _, writer in held:
                writer.close()


async def test_without_the_deadline_the_same_connections_hold_the_server() -> None:
    """The attack itself, against uvicorn's plain protocol: the test above can fail."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    async with _serving(H11Protocol) as served:
        held = await _hold(served.port)
        dripper = asyncio.ensure_future(_drip(held))
        try:
            await asyncio.sleep(3 * HEADER_TIMEOUT)
            assert (await ask(served.port, get("/healthz")))[0] == 503
            # the probes have a port of their own, and answer
            assert await ask(served.probe_port, get("/healthz")) == (200, b"ok\n")
            assert await ask(served.probe_port, get("/readyz")) == (200, b"ready\n")
        finally:
            dripper.cancel()
            for _, writer in held:
                writer.close()


def _post(headers: str) -> bytes:
    return (
        "POST /api/v1/namespaces/team-a/runs/nightly/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Length: 2\r\n{headers}\r\n{{}}"
    ).encode()


async def test_a_cross_site_post_is_refused_before_anything_else() -> None:
    async with _serving(QuickDeadline) as served:
        for cross_site in ("Content-Type: text/plain\r\n", ""):
            status, body = await ask(served.port, _post(cross_site))
            assert status == 403, body
            assert b"must carry the header X-FlowForge-Request" in body
        # the UI's header, or a JSON body (which needs a CORS preflight), gets through the
        # guard: the next refusal is authentication's
        for same_site in ("X-FlowForge-Request: 1\r\n", "Content-Type: application/json\r\n"):
            status, body = await ask(served.port, _post(same_site))
            assert status == 401, body


async def test_stream_slots_are_counted_before_any_await() -> None:
    slots = StreamSlots(total=64, per_user=8)
    taken: list[Any] = []
    refused: list[str] = []

    async def open_stream(user: str) -> None:
        await asyncio.sleep(0)  # the request's authentication and authorization
        try:
            taken.append(slots.take(user))
        except ApiError as error:
            refused.append(error.message)
            return
        await asyncio.sleep(0.01)  # the snapshot: every other request runs meanwhile

    await asyncio.gather(*(open_stream(f"user-{i % 40}") for i in range(255)))
    assert len(taken) == slots.open == 64
    assert any("already serves 64 streams" in message for message in refused)
    for slot in taken:
        slot.release()
        slot.release()  # once only, however the stream ends
    assert slots.open == 0


def test_one_user_holds_at_most_its_share_of_streams() -> None:
    slots = StreamSlots(total=64, per_user=8)
    mine = [slots.take("mallory") for _ in range(8)]
    with pytest.raises(ApiError, match="mallory already has 8 live streams open"):
        slots.take("mallory")
    assert slots.take("alice").user == "alice"
    mine[0].release()
    assert slots.take("mallory").user == "mallory"
