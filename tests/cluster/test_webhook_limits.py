"""The webhook's HTTPS server bounds every request: handshake and body read time out, open
connections are limited, bodies are capped, and a client without the CA's certificate never
gets past the handshake.

The server runs in-process with small limits; in place of kopf's admission function it gets
one that answers every review it is handed (these tests are about what reaches it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flowforge.admission.certs import (
    ClientCertificates,
    WebhookCertificates,
    generate_client_certificates,
    generate_webhook_certificates,
)
from flowforge.admission.transport import GuardedWebhookServer, ServerLimits
from flowforge.kube.probes import start_probe_server
from tests.support.waiting import wait_until

LIMITS = ServerLimits(
    max_body_bytes=64 * 1024,
    read_timeout_seconds=0.5,
    handshake_timeout_seconds=0.5,
    keepalive_timeout_seconds=5,
    max_connections=2,
    reload_interval_seconds=0.2,
)
REVIEW = b'{"request": {"uid": "u-1", "namespace": "a", "object": {}}}'


@dataclass
class Served:
    directory: Path
    port: int
    certs: WebhookCertificates
    client: ClientCertificates
    reviews: list[dict[str, Any]]
    server: GuardedWebhookServer

    def context(self, *, with_certificate: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.certs.ca_cert_path))
        if with_certificate:
            context.load_cert_chain(self.client.cert_path, self.client.key_path)
        return context


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def _serving(
    tmp_path: Path, limits: ServerLimits, *, check_clients: bool = True
) -> AsyncIterator[Served]:
    certs = generate_webhook_certificates(tmp_path / "serving")
    client = generate_client_certificates(tmp_path / "client")
    reviews: list[dict[str, Any]] = []

    async def answer(review: dict[str, Any], **_: Any) -> dict[str, Any]:
        reviews.append(review)
        return {"response": {"uid": review["request"]["uid"], "allowed": True}}

    port = _free_port()
    server = GuardedWebhookServer(
        addr="127.0.0.1",
        port=port,
        certs=certs,
        client_ca=client.ca_cert_path if check_clients else None,
        limits=limits,
    )
    configs = server(answer)  # type: ignore[arg-type]
    await anext(configs)
    serving = asyncio.ensure_future(anext(configs))
    try:
        yield Served(
            directory=tmp_path,
            port=port,
            certs=certs,
            client=client,
            reviews=reviews,
            server=server,
        )
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await serving
        await configs.aclose()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with _serving(tmp_path, LIMITS) as serving:
        yield serving


async def _connect(
    served: Served, *, with_certificate: bool = True, source: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        "127.0.0.1",
        served.port,
        ssl=served.context(with_certificate=with_certificate),
        local_addr=(source, 0),
    )


def _request(body: bytes, *, length: int | None = None) -> bytes:
    return (
        b"POST /validate-workflowdefinition HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body) if length is None else length}\r\n\r\n".encode()
        + body
    )


async def _status(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), timeout=5)
    if not line:
        raise ConnectionResetError("the server closed the connection without an answer")
    return int(line.split()[1])


async def _answered(
    served: Served, *, errors: tuple[type[Exception], ...], timeout: float = 20.0
) -> int:
    """The status of a review, sent again while connecting fails with one of ``errors``
    (what the server does until it catches up), for at most ``timeout`` seconds."""

    async def answered() -> int | None:
        try:
            reader, writer = await _connect(served)
            writer.write(_request(REVIEW))
            status = await _status(reader)
        except errors:
            return None
        writer.close()
        return status

    found: int = await wait_until(
        answered,
        timeout=timeout,
        interval=LIMITS.reload_interval_seconds / 2,
        what="a review answered, not refused",
    )
    return found


async def test_a_review_from_the_apiserver_is_answered(served: Served) -> None:
    reader, writer = await _connect(served)
    writer.write(_request(REVIEW))
    assert await _status(reader) == 200
    writer.close()
    assert served.reviews[0]["request"]["uid"] == "u-1"


async def test_without_a_certificate_nothing_gets_through(served: Served) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        reader, writer = await _connect(served, with_certificate=False)
        writer.write(_request(REVIEW))
        await _status(reader)
    assert served.reviews == []


async def test_a_body_sent_too_slowly_times_out(served: Served) -> None:
    reader, writer = await _connect(served)
    started = time.monotonic()
    writer.write(_request(REVIEW[:10], length=len(REVIEW)))
    assert await _status(reader) == 408
    assert time.monotonic() - started < LIMITS.read_timeout_seconds + 2
    writer.close()
    assert served.reviews == []


async def test_a_body_over_the_limit_is_refused(served: Served) -> None:
    reader, writer = await _connect(served)
    writer.write(_request(b" " * (LIMITS.max_body_bytes + 1)))
    assert await _status(reader) == 413
    writer.close()
    assert served.reviews == []


async def test_a_silent_connection_is_dropped_after_the_handshake_timeout(
    served: Served,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)  # no TLS at all
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    assert time.monotonic() - started < LIMITS.handshake_timeout_seconds + 2
    writer.close()


async def _hold_every_connection(
    served: Served, count: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``count`` answered connections kept open, then one more refused at once."""
    held = [await _connect(served) for _ in range(count)]
    for _, writer in held:  # a request makes each connection count as established
        writer.write(_request(REVIEW))
    for reader, _ in held:
        assert await _status(reader) == 200
        await reader.readuntil(b"}}")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        reader, writer = await _connect(served)
        writer.write(_request(REVIEW))
        await _status(reader)
    return held


async def test_connections_over_the_limit_are_closed_at_once(served: Served) -> None:
    held = await _hold_every_connection(served, LIMITS.max_connections)
    for _, writer in held:
        writer.close()
        await writer.wait_closed()
    # the server notices the closes when its loop gets to them: the slots come back then
    assert await _answered(served, errors=(ssl.SSLError, ConnectionError)) == 200


async def test_renewed_certificate_files_are_served_without_a_restart(served: Served) -> None:
    old = served.context()
    await asyncio.sleep(0.05)  # a later modification time than the first files
    served.certs = generate_webhook_certificates(served.directory / "serving")
    # trusts only the new CA: refused until the server has reloaded its files
    assert await _answered(served, errors=(ssl.SSLCertVerificationError,)) == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncio.open_connection("127.0.0.1", served.port, ssl=old)


# Slow clients: the attacks run against a webhook that accepts any client (acceptAnyClient),
# where any pod reaching the Service may try them; each attacker connects from 127.0.0.2.

ATTACKER = "127.0.0.2"


async def _closed_by_the_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), timeout=10) == b""
    except (ConnectionError, ssl.SSLError):
        return True


async def test_connections_that_never_finish_their_headers_do_not_stop_admission(
    tmp_path: Path,
) -> None:
    limits = ServerLimits(header_timeout_seconds=0.5, max_connections_per_source=128)
    async with _serving(tmp_path, limits, check_clients=False) as served:
        held = [await _connect(served, source=ATTACKER) for _ in range(limits.max_connections)]
        silent, dripping = held[::2], held[1::2]
        for _, writer in dripping:
            writer.write(b"POST /validate-workflowdefinition HTTP/1.1\r\n")

        async def drip() -> None:
            for _ in range(40):  # a header byte every 0.1 s, never the blank line
                for _, writer in dripping:
                    if not writer.is_closing():
                        with contextlib.suppress(ConnectionError, ssl.SSLError):
                            writer.write(b"X")
                await asyncio.sleep(0.1)

        dripper = asyncio.ensure_future(drip())
        # every slot is taken: the review is refused until the deadline frees them, then
        # answered (the apiserver's own retries and timeout are 10 s)
        assert await _answered(served, errors=(ssl.SSLError, ConnectionError), timeout=8) == 200
        assert served.reviews[-1]["request"]["uid"] == "u-1"
        for reader, _ in silent + dripping:
            assert await _closed_by_the_server(reader)
        dripper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripper
        for _, writer in held:
            writer.close()


async def test_one_source_cannot_take_every_connection(tmp_path: Path) -> None:
    limits = ServerLimits(max_connections=8, max_connections_per_source=4)
    async with _serving(tmp_path, limits, check_clients=False) as served:
        held = [
            await _connect(served, source=ATTACKER)
            for _ in range(limits.max_connections_per_source)
        ]
        over_reader, over_writer = await _connect(served, source=ATTACKER)
        over_writer.write(_request(REVIEW))
        assert await _closed_by_the_server(over_reader)
        # another source still gets its slots, at once
        reader, writer = await _connect(served)
        writer.write(_request(REVIEW))
        assert await _status(reader) == 200
        writer.close()
        for _, attacker in held:
            attacker.close()


async def _probe(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    status = await _status(reader)
    writer.close()
    return status


async def test_the_probes_answer_while_every_tls_connection_is_held(tmp_path: Path) -> None:
    limits = ServerLimits(max_connections=2, max_connections_per_source=2)
    probe_port = _free_port()
    async with _serving(tmp_path, limits) as served:
        probes = await start_probe_server(
            host="127.0.0.1", port=probe_port, ready=lambda: served.server.serving
        )
        # the TLS port is full: a TCP check would still pass, a review is refused
        held = await _hold_every_connection(served, limits.max_connections)
        assert await _probe(probe_port, "/healthz") == 200
        assert await _probe(probe_port, "/readyz") == 200
        assert await _probe(probe_port, "/validate-workflowdefinition") == 404
        for _, writer in held:
            writer.close()
    # the TLS listener is closed: not ready, though the probe port still answers
    assert await _probe(probe_port, "/readyz") == 503
    assert await _probe(probe_port, "/healthz") == 200
    probes.close()
