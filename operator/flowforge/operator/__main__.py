"""``python -m flowforge.operator``: run the FlowForge operator (kopf) in this process.

Flags override the ``FLOWFORGE_*`` environment variables. Nothing binds a non-loopback
address unless asked (the metrics endpoint and kopf's liveness probe are off or on
127.0.0.1).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence


def _environment(args: argparse.Namespace) -> None:
    pairs = {
        "FLOWFORGE_DSN": args.dsn,
        "FLOWFORGE_NAMESPACES": ",".join(args.namespace or []) or None,
        "FLOWFORGE_KUBECONFIG": args.kubeconfig,
        "KUBECONFIG": args.kubeconfig,
        "FLOWFORGE_METRICS_PORT": None if args.metrics_port is None else str(args.metrics_port),
        "FLOWFORGE_HEALTH_PORT": None if args.health_port is None else str(args.health_port),
        "FLOWFORGE_RECONCILE_INTERVAL": args.reconcile_interval,
        "FLOWFORGE_JOB_TTL": args.job_ttl,
        "FLOWFORGE_IDENTITY": args.identity,
    }
    for name, value in pairs.items():
        if value is not None:
            os.environ[name] = str(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowforge.operator")
    parser.add_argument("--dsn", help="PostgreSQL DSN (FLOWFORGE_DSN)")
    parser.add_argument(
        "--namespace",
        action="append",
        help="watch this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster/KUBECONFIG)")
    parser.add_argument("--metrics-port", type=int, help="serve /metrics on 127.0.0.1:PORT")
    parser.add_argument(
        "--health-port", type=int, help="serve /healthz and /readyz on 127.0.0.1:PORT"
    )
    parser.add_argument("--reconcile-interval", type=float, help="seconds between passes")
    parser.add_argument(
        "--job-ttl",
        type=float,
        help="seconds to keep a finished Job after its outcome is recorded (negative: keep)",
    )
    parser.add_argument("--identity", help="lease holder identity (default: host-pid)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    _environment(args)
    if not os.environ.get("FLOWFORGE_DSN"):
        parser.error("a PostgreSQL DSN is required (--dsn or FLOWFORGE_DSN)")
    import kopf

    from flowforge.operator.settings import OperatorSettings

    try:
        settings = OperatorSettings.from_environment()
    except ValueError as error:
        parser.error(str(error))
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
    )
    if not args.verbose:
        # kopf logs "Handler 'job_event' succeeded." for every watch event: a line per Job
        # change, formatted on the hot path; its warnings and errors still show
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    import flowforge.operator.handlers  # noqa: F401  (registers the handlers)

    namespaces = [n for n in os.environ.get("FLOWFORGE_NAMESPACES", "").split(",") if n]
    kopf.run(
        standalone=True, clusterwide=not namespaces, namespaces=namespaces, liveness_endpoint=None
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
