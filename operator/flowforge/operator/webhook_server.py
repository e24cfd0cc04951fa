"""Run only FlowForge's admission webhooks under kopf, on an explicit address and port.

    python -m flowforge.operator.webhook_server --port 9443 --certs DIR --dsn DSN \\
        [--kubeconfig FILE] [--addr 127.0.0.1]

kopf serves admission only from inside `kopf.operator()`, so this runs an operator whose
registry holds nothing but the admission handlers (plus kopf's default login). It needs the
Kubernetes API for resource discovery. The webhook configurations are not managed by kopf:
apply them with `flowforge.kube.webhook_config.apply_webhook_configurations`.
If DIR holds no certificate, a CA and a serving certificate for 127.0.0.1 are generated there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf

from flowforge.domain.api import FINALIZER, PREFIX
from flowforge.operator.certs import WebhookCertificates, generate_webhook_certificates
from flowforge.operator.definition_registry import StoreDefinitionRegistry
from flowforge.operator.webhooks import register_admission_handlers
from flowforge.store.pool import open_pool

# The apiserver accepts request bodies up to 3 MiB and a review of an UPDATE carries both the
# object and the old object; aiohttp's default limit of 1 MiB would turn a large definition
# into a webhook failure instead of a verdict.
MAX_REVIEW_BYTES = 8 * 1024 * 1024
# kopf deep-copies every reviewed object recursively (and json.loads recurses): a document
# nested a few hundred levels deep would end in a RecursionError and an HTTP 500. Nothing
# legitimate comes close to this limit (a task config nested 80 levels deep still passes).
MAX_REVIEW_DEPTH = 100

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]")
_REQUEST_UID = re.compile(r'"uid"\s*:\s*"([^"\\]*)"')


def json_nesting_depth(text: str) -> int:
    """How deeply the JSON text nests arrays and objects, without parsing (or recursing)."""
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(1 if char in "[{" else -1 for char in brackets), default=0)


def _too_deep_review(text: str, depth: int) -> dict[str, Any]:
    # The request's uid is the first "uid" of an AdmissionReview as the apiserver writes it.
    uid = _REQUEST_UID.search(text)
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": uid.group(1) if uid else "",
            "allowed": False,
            "status": {
                "code": 422,
                "message": f"the document nests {depth} levels deep; FlowForge accepts at most "
                f"{MAX_REVIEW_DEPTH} (counting from the AdmissionReview, task configs included)",
            },
        },
    }


class AdmissionWebhookServer(kopf.WebhookServer):
    """kopf's WebhookServer with a body limit that fits the apiserver's and a depth guard."""

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        request._client_max_size = MAX_REVIEW_BYTES
        text = await request.text()  # aiohttp keeps the body: kopf's read below is served from it
        depth = json_nesting_depth(text)
        if depth > MAX_REVIEW_DEPTH:
            return aiohttp.web.json_response(_too_deep_review(text, depth))
        response: aiohttp.web.Response = await kopf.WebhookServer._serve(fn, request)
        return response


def configure_admission_settings(
    settings: kopf.OperatorSettings,
    *,
    port: int,
    certs: WebhookCertificates,
    addr: str = "127.0.0.1",
) -> None:
    """Serve admission on addr:port with our certificates; keep kopf's marks under our prefix."""
    settings.admission.server = AdmissionWebhookServer(
        addr=addr,
        port=port,
        host=addr,
        certfile=str(certs.cert_path),
        pkeyfile=str(certs.key_path),
        cafile=str(certs.ca_cert_path),
    )
    settings.admission.managed = None
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX)


def register_login(registry: kopf.OperatorRegistry) -> None:
    """A plain OperatorRegistry has no login handler: read $KUBECONFIG when it is set (at
    login time, so `--kubeconfig` works), else the in-cluster service account."""

    @kopf.on.login(registry=registry)
    def login_from_kubeconfig_or_cluster(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if os.environ.get("KUBECONFIG"):
            from_file: kopf.ConnectionInfo | None = kopf.login_with_kubeconfig(**kwargs)
            return from_file
        in_cluster: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
        return in_cluster


def ensure_certificates(directory: Path) -> WebhookCertificates:
    certs = WebhookCertificates.in_directory(directory)
    if certs.cert_path.exists() and certs.key_path.exists() and certs.ca_cert_path.exists():
        return certs
    return generate_webhook_certificates(directory)


async def serve_webhooks(
    *,
    port: int,
    certs: WebhookCertificates,
    dsn: str,
    addr: str = "127.0.0.1",
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Serve the admission webhooks until stopped (signal or `stop_flag`)."""
    pool = await open_pool(dsn, min_size=1, max_size=8, name="flowforge-webhooks")
    try:
        definitions = StoreDefinitionRegistry(pool)
        registry = kopf.OperatorRegistry()
        register_login(registry)
        register_admission_handlers(registry, definitions=lambda: definitions)
        settings = kopf.OperatorSettings()
        configure_admission_settings(settings, port=port, certs=certs, addr=addr)
        await kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=True,
            standalone=True,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        await pool.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--addr", default="127.0.0.1")
    parser.add_argument("--certs", type=Path, required=True, help="directory of ca.crt/tls.*")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("FLOWFORGE_DSN"),
        help="PostgreSQL DSN of the store (default: $FLOWFORGE_DSN, which keeps it out of ps)",
    )
    parser.add_argument("--kubeconfig", type=Path, help="defaults to $KUBECONFIG")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("a PostgreSQL DSN is required (--dsn or FLOWFORGE_DSN)")
    if args.kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(args.kubeconfig)
    kopf.configure(verbose=args.verbose)
    certs = ensure_certificates(args.certs)
    asyncio.run(serve_webhooks(port=args.port, certs=certs, dsn=args.dsn, addr=args.addr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
