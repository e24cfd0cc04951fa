"""The read API's application under uvicorn in this process, on 127.0.0.1, and a raw HTTP/1.1
client for it (what a browser or an attacker sends, byte for byte)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from flowforge.server.app import create_app
from flowforge.server.limits import HeaderDeadlineH11Protocol


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Served:
    port: int
    probe_port: int


@contextlib.asynccontextmanager
async def serving(
    state: Callable[[], Awaitable[Any]],
    *,
    protocol: type[asyncio.Protocol] = HeaderDeadlineH11Protocol,
    connections: int = 64,
) -> AsyncIterator[Served]:
    """``create_app(state)`` served until the block ends (its probes on a port of their own)."""

    async def close(_: Any) -> None:
        return None

    served = Served(port=free_port(), probe_port=free_port())
    app = create_app(state, close=close, probe_address=("127.0.0.1", served.probe_port))
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=served.port,
        http=protocol,
        limit_concurrency=connections,
        timeout_keep_alive=5,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        assert not task.done(), "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        yield served
    finally:
        server.should_exit = True
        server.force_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)


async def ask(port: int, request: bytes, *, timeout: float = 5) -> tuple[int, bytes]:
    """Send ``request`` on a new connection: the answer's status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=timeout)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await asyncio.wait_for(reader.readexactly(length), timeout=timeout)
        return int(head.split()[1]), body
    finally:
        writer.close()


def get(path: str, *, token: str | None = None) -> bytes:
    """A GET of ``path``, with a bearer token when given."""
    authorization = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{authorization}\r\n".encode()


async def get_json(port: int, path: str, *, token: str, timeout: float = 30) -> Any:
    """The JSON a GET answers with 200 (anything else fails the test, naming the answer)."""
    status, body = await ask(port, get(path, token=token), timeout=timeout)
    assert status == 200, (path, status, body[:500])
    return json.loads(body)
