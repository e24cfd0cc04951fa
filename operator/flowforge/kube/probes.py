"""``/healthz`` and ``/readyz`` in plain HTTP on a port of their own, for the kubelet: a probe
is answered even while every connection of the served port is held (the read API's uvicorn
then answers 503 to everything there; the webhook's TLS port refuses connections over its
cap), so a kubelet does not restart a server that is merely busy, and a busy one is not
marked ready by accident. Each probe connection gets one short request and is closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Final

PROBE_TIMEOUT_SECONDS: Final = 2.0
MAX_PROBE_HEADER_BYTES: Final = 4096


def _answer(status: str, text: str) -> bytes:
    body = text.encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


async def start_probe_server(*, host: str, port: int, ready: Callable[[], bool]) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > MAX_PROBE_HEADER_BYTES:
                return
            method, _, rest = head.partition(b" ")
            path = rest.split(b" ", 1)[0]
            if method not in (b"GET", b"HEAD"):
                writer.write(_answer("405 Method Not Allowed", "GET only\n"))
            elif path == b"/healthz":
                writer.write(_answer("200 OK", "ok\n"))
            elif path == b"/readyz":
                writer.write(
                    _answer("200 OK", "ready\n")
                    if ready()
                    else _answer("503 Service Unavailable", "not ready\n")
                )
            else:
                writer.write(_answer("404 Not Found", "/healthz or /readyz\n"))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    return await asyncio.start_server(
        answer, host, port, limit=MAX_PROBE_HEADER_BYTES, reuse_address=True
    )
