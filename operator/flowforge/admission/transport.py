"""The HTTPS server of the admission webhooks, as a kopf webhook server (kopf's documented
protocol for custom servers: called with kopf's `WebhookFn`, it yields the client config).

It answers only the apiserver: with a client CA, the TLS handshake requires a client
certificate signed by it (the apiserver presents one through its AdmissionConfiguration).
Every request is bounded: the handshake, the request headers (from the handshake or the
previous answer) and the body read by timeouts, the body by aiohttp's `client_max_size`, the
open connections by a total and a per-source limit (one over either is closed at once,
`connection_limits`), and the body's nesting by `review_guard` before kopf parses anything.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf

from flowforge.admission.certs import WebhookCertificates
from flowforge.admission.connection_limits import (
    ConnectionGuard,
    ConnectionLimits,
    GuardedProtocol,
)
from flowforge.admission.guard import BadReviewError, read_review

logger = logging.getLogger("flowforge.webhooks")


@dataclass(frozen=True)
class ServerLimits:
    # The apiserver accepts bodies up to 3 MiB and a review of an UPDATE carries the object
    # twice; aiohttp's default of 1 MiB would turn a large definition into a webhook failure.
    max_body_bytes: int = 8 * 1024 * 1024
    # The apiserver gives a webhook at most 30 s (ours: 10 s), body upload included.
    read_timeout_seconds: float = 10.0
    handshake_timeout_seconds: float = 5.0
    keepalive_timeout_seconds: float = 30.0
    max_connections: int = 128
    max_connections_per_source: int = 64
    # a connection that has not sent a request's headers by then is closed (slow clients)
    header_timeout_seconds: float = 10.0
    # seconds between checks of the certificate files (rotated by cert-manager, a Secret...)
    reload_interval_seconds: float = 10.0


def _reason(error: Exception) -> str:
    return " ".join(str(error).split())[:200] or type(error).__name__


class GuardedWebhookServer:
    """Serves kopf's admission handlers at https://addr:port/<handler-id>."""

    def __init__(
        self,
        *,
        addr: str,
        port: int,
        certs: WebhookCertificates,
        client_ca: Path | None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.addr = addr
        self.port = port
        self.certs = certs
        self.client_ca = client_ca
        self.limits = limits or ServerLimits()
        # true while the TLS listener accepts connections: the readiness probe's answer
        self.serving = False

    def _files(self) -> list[Path]:
        files = [self.certs.cert_path, self.certs.key_path]
        return files if self.client_ca is None else [*files, self.client_ca]

    def _load(self, context: ssl.SSLContext) -> None:
        context.load_cert_chain(self.certs.cert_path, self.certs.key_path)
        if self.client_ca is not None:
            context.load_verify_locations(cafile=str(self.client_ca))

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
        self._load(context)
        return context

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        context = self.ssl_context()
        app = aiohttp.web.Application(client_max_size=self.limits.max_body_bytes)
        guard = ConnectionGuard(
            ConnectionLimits(
                max_connections=self.limits.max_connections,
                max_per_source=self.limits.max_connections_per_source,
                header_timeout_seconds=self.limits.header_timeout_seconds,
                idle_timeout_seconds=self.limits.keepalive_timeout_seconds,
            )
        )

        async def serve(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
            guard.request_started(request.transport)
            try:
                return await self._serve(fn, request)
            finally:
                guard.request_finished(request.transport)

        app.router.add_post("/{id:[-a-z0-9]*}", serve)
        runner = aiohttp.web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            keepalive_timeout=self.limits.keepalive_timeout_seconds,
        )
        await runner.setup()
        server = runner.server
        assert server is not None

        def connection() -> asyncio.BaseProtocol:
            return GuardedProtocol(server(), guard)

        listener = await asyncio.get_running_loop().create_server(
            connection,
            self.addr,
            self.port,
            ssl=context,
            ssl_handshake_timeout=self.limits.handshake_timeout_seconds,
            reuse_address=True,
        )
        self.serving = True
        try:
            url = f"https://{self.addr}:{self.port}"
            logger.info(
                "serving admission webhooks at %s (client certificate %s)",
                url,
                "required" if self.client_ca else "not required",
            )
            ca_bundle = base64.b64encode(self.certs.ca_pem).decode("ascii")
            yield kopf.WebhookClientConfig(url=url, caBundle=ca_bundle)
            await self._reload_forever(context)
        finally:
            self.serving = False
            listener.close()
            with contextlib.suppress(Exception):
                await listener.wait_closed()
            await runner.cleanup()

    async def _reload_forever(self, context: ssl.SSLContext) -> None:
        """Load renewed certificate files into the live context (new handshakes use them)."""
        seen = [path.stat().st_mtime_ns for path in self._files()]
        while True:
            await asyncio.sleep(self.limits.reload_interval_seconds)
            try:
                current = [path.stat().st_mtime_ns for path in self._files()]
                if current != seen:
                    self._load(context)
                    seen = current
                    logger.info("reloaded the webhook's certificate files")
            except (OSError, ssl.SSLError) as error:
                logger.warning("certificate files not reloaded: %s", error)

    async def _serve(
        self, fn: kopf.WebhookFn, request: aiohttp.web.Request
    ) -> aiohttp.web.StreamResponse:
        try:
            async with asyncio.timeout(self.limits.read_timeout_seconds):
                body = await request.read()
        except TimeoutError:
            raise aiohttp.web.HTTPRequestTimeout(reason="the body was not sent in time") from None
        try:
            read = read_review(body)
        except BadReviewError as error:
            raise aiohttp.web.HTTPBadRequest(reason=_reason(error)) from None
        if read.denial is not None:
            return aiohttp.web.json_response(read.denial)
        assert read.review is not None
        review: Any = read.review
        transport = request.transport
        try:
            response = await fn(
                review,
                webhook=request.match_info.get("id"),
                headers=dict(request.headers),
                sslpeer=transport.get_extra_info("peercert") if transport else None,
            )
        except Exception as error:  # kopf's own refusals: unknown resource, missing data
            logger.warning("admission request not served: %s", error)
            raise aiohttp.web.HTTPBadRequest(reason=_reason(error)) from None
        return aiohttp.web.json_response(response)
