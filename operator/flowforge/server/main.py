"""``flowforge server`` (also ``python -m flowforge.server``): the read API and the web UI.

Configuration, flags over environment: ``--dsn`` (``FLOWFORGE_SERVER_DSN``, else
``FLOWFORGE_DSN``) names a login that is a member of ``flowforge_server`` (``store/roles.py``:
it reads only the namespaces each request is scoped to); the server refuses to start on a
login that may write, bypass row-level security or own the tables. ``--kubeconfig`` (else
in-cluster, else ``$KUBECONFIG``) gives the server's own credentials, used only for
TokenReviews, SubjectAccessReviews and the list of namespaces; ``--host`` (127.0.0.1) and
``--port`` (8080) where it listens, ``--probe-port`` (none; the chart's 8081) where
``/healthz`` and ``/readyz`` answer.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from flowforge.kube.access_review import CachedAccessReviewer
from flowforge.kube.reviews import ApiReviews
from flowforge.kube.user_api import UserApi
from flowforge.server.access import Authenticator, Authorizer
from flowforge.server.app import create_app
from flowforge.server.limits import HeaderDeadlineH11Protocol
from flowforge.server.state import ServerState
from flowforge.server.static import STATIC_DIR
from flowforge.store.errors import LoginTooPowerfulError
from flowforge.store.pool import open_pool
from flowforge.store.roles import require_read_only_login
from flowforge.store.session import SessionLimits

DEFAULT_PORT = 8080
MAX_CONNECTIONS = 256


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flowforge server", description="Serve the read API and the web UI."
    )
    add_server_arguments(parser)
    return parser.parse_args(argv)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn", help="the store, as a flowforge_server login (FLOWFORGE_SERVER_DSN)"
    )
    parser.add_argument("--kubeconfig", help="the server's own credentials (default: in-cluster)")
    parser.add_argument("--host", default=os.environ.get("FLOWFORGE_SERVER_HOST", "127.0.0.1"))
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("FLOWFORGE_SERVER_PORT", DEFAULT_PORT))
    )
    parser.add_argument(
        "--probe-port",
        type=int,
        default=int(os.environ.get("FLOWFORGE_SERVER_PROBE_PORT", "0")),
        help="/healthz and /readyz on a port of their own (the chart: 8081; 0: none)",
    )
    parser.add_argument("--static-dir", type=Path, default=STATIC_DIR, help=argparse.SUPPRESS)
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=float(os.environ.get("FLOWFORGE_SERVER_POLL_SECONDS", "0.3")),
        help="how often a live stream looks for changes (0.3)",
    )


def serve(args: argparse.Namespace) -> int:
    dsn = args.dsn or os.environ.get("FLOWFORGE_SERVER_DSN") or os.environ.get("FLOWFORGE_DSN")
    if not dsn:
        print("flowforge server: no store: pass --dsn or set FLOWFORGE_SERVER_DSN", file=sys.stderr)
        return 2
    kubeconfig = args.kubeconfig or os.environ.get("FLOWFORGE_KUBECONFIG")

    async def start() -> ServerState:
        pool = await open_pool(
            dsn,
            min_size=1,
            max_size=8,
            name="flowforge-server",
            limits=SessionLimits(),
            wait_seconds=10.0,
        )
        try:
            async with pool.connection() as connection:
                await require_read_only_login(connection)
        except LoginTooPowerfulError as refused:
            logging.getLogger("flowforge.server").error("refusing to start: %s", refused)
            await pool.close()
            raise
        reviews = ApiReviews.connect(kubeconfig=kubeconfig)
        configuration = reviews.configuration
        return ServerState(
            pool=pool,
            reviews=reviews,
            authenticator=Authenticator(reviews),
            authorizer=Authorizer(CachedAccessReviewer(reviews.review_access)),
            user_api=UserApi(
                host=str(configuration.host),
                ca_file=configuration.ssl_ca_cert,
                verify=bool(configuration.verify_ssl),
            ),
            poll_seconds=args.poll_seconds,
        )

    async def close(state: ServerState) -> None:
        await state.user_api.close()
        await state.pool.close()
        state.reviews.close()
        state.close()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_app(
        start,
        close=close,
        static_dir=args.static_dir,
        probe_address=(args.host, args.probe_port) if args.probe_port else None,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        # a connection's request headers arrive in time or it is closed (limits.py)
        http=HeaderDeadlineH11Protocol,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=32 * 1024,
        server_header=False,
        access_log=False,
        log_level="info",
    )
    uvicorn.Server(config).run()  # a failed start (a refused login) exits with status 3
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return serve(parse_args(argv))


def run_from_cli(args: argparse.Namespace) -> int:
    """``flowforge server OPTIONS``: the CLI hands its words over unparsed."""
    return main(list(args.options))
