"""Run only FlowForge's admission webhooks under kopf, on an explicit address and port.

    python -m flowforge.admission.server --port 9443 --certs DIR --dsn DSN \\
        --client-ca FILE [--kubeconfig FILE] [--addr 127.0.0.1] \\
        [--probe-port 8081 --probe-addr POD_IP]

kopf serves admission only from inside `kopf.operator()`, so this runs an operator whose
registry holds nothing but the admission handlers (plus kopf's default login). It needs the
Kubernetes API for resource discovery. The webhook configurations are not managed by kopf:
apply them with `flowforge.kube.webhook_config.apply_webhook_configurations`.
If DIR holds no certificate, a CA and a serving certificate for 127.0.0.1 are generated there.
With --client-ca only clients presenting a certificate signed by that CA (the apiserver) get
past the TLS handshake; `--client-ca none` serves anyone, for a cluster that cannot present one.
With --probe-port, `/healthz` and `/readyz` are answered in plain HTTP on a port of their own
(the kubelet has no client certificate, and the TLS port may be full): `/readyz` is 200 only
while the TLS listener accepts connections.
Admission reads the store (published definitions) and the apiserver (WorkflowDefinition and
FlowForgePolicy objects, SubjectAccessReviews of the requesting user, dry-run creations of
each task type's Job and Pod), and writes neither.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kopf

from flowforge.admission.access import AccessChecks
from flowforge.admission.certs import WebhookCertificates, generate_webhook_certificates
from flowforge.admission.dryrun import DryRunBudget
from flowforge.admission.handlers import register_admission_handlers
from flowforge.admission.registry import StoreDefinitionRegistry
from flowforge.admission.run_sources import StoreRetrySources
from flowforge.admission.transport import GuardedWebhookServer
from flowforge.domain.api import FINALIZER, PREFIX
from flowforge.kube.access_review import CachedAccessReviewer
from flowforge.kube.client import KubeClient
from flowforge.kube.dryrun import CachedDryRuns, DryRunner
from flowforge.kube.probes import start_probe_server
from flowforge.store.holdings import namespace_holdings
from flowforge.store.pool import open_pool
from flowforge.store.session import WEBHOOK_LIMITS


def configure_admission_settings(
    settings: kopf.OperatorSettings,
    *,
    port: int,
    certs: WebhookCertificates,
    client_ca: Path | None,
    addr: str = "127.0.0.1",
) -> GuardedWebhookServer:
    """Serve admission on addr:port with our certificates; keep kopf's marks under our prefix."""
    server = GuardedWebhookServer(addr=addr, port=port, certs=certs, client_ca=client_ca)
    settings.admission.server = server
    settings.admission.managed = None
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX)
    return server


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
    client_ca: Path | None,
    dsn: str,
    addr: str = "127.0.0.1",
    probe_address: tuple[str, int] | None = None,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Serve the admission webhooks until stopped (signal or `stop_flag`), and the probes
    on `probe_address` (host, port) when given."""
    pool = await open_pool(
        dsn,
        min_size=1,
        max_size=8,
        name="flowforge-webhooks",
        limits=WEBHOOK_LIMITS,
        wait_seconds=1.0,
    )
    kube = KubeClient.connect(kubeconfig=os.environ.get("KUBECONFIG") or None, threads=8)
    dry_runner = DryRunner(kube.api_client)
    dry_runs = CachedDryRuns(dry_runner)
    try:
        definitions = StoreDefinitionRegistry(pool, list_definitions=kube.list_definitions)
        registry = kopf.OperatorRegistry()
        register_login(registry)
        runs = StoreRetrySources(pool)
        access = AccessChecks(
            reviewer=CachedAccessReviewer(kube.review_access),
            list_policies=lambda namespace: kube.list_policies(namespace=namespace),
            load_definition=definitions.load_definition,
            holdings=lambda namespace: namespace_holdings(pool, namespace),
        )
        register_admission_handlers(
            registry,
            definitions=lambda: definitions,
            runs=lambda: runs,
            access=lambda: access,
            dry_run=lambda: dry_runs,
            dry_run_budget=DryRunBudget(),
        )
        settings = kopf.OperatorSettings()
        server = configure_admission_settings(
            settings, port=port, certs=certs, client_ca=client_ca, addr=addr
        )
        probes = None
        if probe_address is not None:
            probe_host, probe_port = probe_address
            probes = await start_probe_server(
                host=probe_host, port=probe_port, ready=lambda: server.serving
            )
        try:
            await kopf.operator(
                registry=registry,
                settings=settings,
                clusterwide=True,
                standalone=True,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
            )
        finally:
            if probes is not None:
                probes.close()
    finally:
        dry_runner.close()
        kube.close()
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
    parser.add_argument(
        "--client-ca",
        required=True,
        help="CA file that signs the apiserver's client certificate, or 'none' (not verified)",
    )
    parser.add_argument(
        "--probe-port",
        type=int,
        default=0,
        help="plain-HTTP port of /healthz and /readyz (default: none)",
    )
    parser.add_argument(
        "--probe-addr",
        help="address of the probe port (default: --addr; the chart's: the Pod IP)",
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
    client_ca = None if args.client_ca == "none" else Path(args.client_ca)
    asyncio.run(
        serve_webhooks(
            port=args.port,
            certs=certs,
            client_ca=client_ca,
            dsn=args.dsn,
            addr=args.addr,
            probe_address=(
                (args.probe_addr or args.addr, args.probe_port) if args.probe_port else None
            ),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
