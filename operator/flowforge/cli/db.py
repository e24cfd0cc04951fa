"""``flowforge db migrate | prune``: schema migrations and retention of the PostgreSQL store.

The DSN comes from ``--dsn`` or the environment variable ``FLOWFORGE_DSN``. ``migrate`` runs
as ``flowforge_migrator`` and ``prune`` as ``flowforge_retention`` (``store/roles.py``): the
DSN's login must be a member of that group role.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from datetime import timedelta

from flowforge.cli.connections import store_dsn
from flowforge.cli.output import EXIT_OK, emit
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool
from flowforge.store.retention import PruneReport, prune


def run_migrate(args: argparse.Namespace) -> int:
    report = asyncio.run(migrate(store_dsn(args), lock_timeout=args.lock_timeout))
    if report.applied:
        applied = ", ".join(str(version) for version in report.applied)
        text = f"applied migrations {applied}; schema is at version {report.schema_version}\n"
    else:
        text = f"schema is up to date at version {report.schema_version}\n"
    emit(
        args.output,
        data=lambda: {"applied": list(report.applied), "schemaVersion": report.schema_version},
        table=lambda _wide: text,
    )
    return EXIT_OK


async def _prune(dsn: str, older_than: timedelta) -> PruneReport:
    pool = await open_pool(dsn, min_size=1, max_size=1, name="flowforge-prune")
    try:
        return await prune(pool, older_than=older_than)
    finally:
        await pool.close()


def run_prune(args: argparse.Namespace) -> int:
    report = asyncio.run(_prune(store_dsn(args), args.older_than))
    emit(args.output, data=lambda: asdict(report), table=lambda _wide: f"{report.describe()}\n")
    return EXIT_OK
