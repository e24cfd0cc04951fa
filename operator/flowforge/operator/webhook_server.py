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
import sys
from collections.abc import Sequence
from pathlib import Path

import kopf

from flowforge.operator.certs import WebhookCertificates, generate_webhook_certificates
from flowforge.operator.definition_registry import StoreDefinitionRegistry
from flowforge.operator.webhooks import register_admission_handlers
from flowforge.store.pool import open_pool

PERSISTENCE_PREFIX = "flowforge.io"
FINALIZER = "flowforge.io/finalizer"


def configure_admission_settings(
    settings: kopf.OperatorSettings,
    *,
    port: int,
    certs: WebhookCertificates,
    addr: str = "127.0.0.1",
) -> None:
    """Serve admission on addr:port with our certificates; keep kopf's marks under our prefix."""
    settings.admission.server = kopf.WebhookServer(
        addr=addr,
        port=port,
        host=addr,
        certfile=str(certs.cert_path),
        pkeyfile=str(certs.key_path),
        cafile=str(certs.ca_cert_path),
    )
    settings.admission.managed = None
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=PERSISTENCE_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PERSISTENCE_PREFIX
    )


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
    parser.add_argument("--dsn", required=True, help="PostgreSQL DSN of the store")
    parser.add_argument("--kubeconfig", type=Path, help="defaults to $KUBECONFIG")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(args.kubeconfig)
    kopf.configure(verbose=args.verbose)
    certs = ensure_certificates(args.certs)
    asyncio.run(serve_webhooks(port=args.port, certs=certs, dsn=args.dsn, addr=args.addr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
