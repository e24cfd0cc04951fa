"""``flowforge db migrate | prune``: schema migrations and retention of the PostgreSQL store.

The DSN comes from ``--dsn`` or the environment variable ``FLOWFORGE_DSN``. Exit codes:
0 success, 1 the database refused (e.g. a schema newer than this FlowForge), 2 usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from datetime import timedelta

import psycopg

from flowforge.domain.errors import FlowForgeError
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool
from flowforge.store.retention import PruneReport, prune

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
DSN_VARIABLE = "FLOWFORGE_DSN"
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or ``2w``."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit s, m, h, d or w (e.g. 30d)"
        )
    return timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = subparsers.add_parser("db", help="manage the PostgreSQL store")
    db_commands = db.add_subparsers(dest="db_command", metavar="COMMAND")
    db.set_defaults(handler=lambda _args: _usage(db))

    migrate_parser = db_commands.add_parser(
        "migrate",
        help="apply the schema migrations (a no-op when up to date)",
        description="Apply missing schema migrations in one transaction, under an advisory "
        "lock. Refuses a database whose schema is newer than this FlowForge knows.",
    )
    _add_dsn(migrate_parser)
    migrate_parser.set_defaults(handler=_migrate)

    prune_parser = db_commands.add_parser(
        "prune",
        help="delete finished runs' task rows and events older than a cutoff",
        description="Delete the task rows, dependency rows and events of runs that finished "
        "before the cutoff. Runs that are not finished are never touched; the run rows stay, "
        "with their final task counts.",
    )
    _add_dsn(prune_parser)
    prune_parser.add_argument(
        "--older-than",
        required=True,
        type=parse_duration,
        metavar="DURATION",
        help="age of a run's finish before it is pruned, e.g. 30d",
    )
    prune_parser.set_defaults(handler=_prune)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _add_dsn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_VARIABLE),
        help=f"PostgreSQL connection string (default: ${DSN_VARIABLE})",
    )


def _dsn(args: argparse.Namespace) -> str | None:
    dsn = args.dsn
    if not dsn:
        print(f"error: no database: pass --dsn or set {DSN_VARIABLE}", file=sys.stderr)
        return None
    return str(dsn)


def _migrate(args: argparse.Namespace) -> int:
    dsn = _dsn(args)
    if dsn is None:
        return EXIT_USAGE
    try:
        report = asyncio.run(migrate(dsn))
    except (FlowForgeError, psycopg.Error) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    if report.applied:
        applied = ", ".join(str(version) for version in report.applied)
        print(f"applied migrations {applied}; schema is at version {report.schema_version}")
    else:
        print(f"schema is up to date at version {report.schema_version}")
    return EXIT_OK


async def _run_prune(dsn: str, older_than: timedelta) -> PruneReport:
    pool = await open_pool(dsn, min_size=1, max_size=1, name="flowforge-prune")
    try:
        return await prune(pool, older_than=older_than)
    finally:
        await pool.close()


def _prune(args: argparse.Namespace) -> int:
    dsn = _dsn(args)
    if dsn is None:
        return EXIT_USAGE
    try:
        report = asyncio.run(_run_prune(dsn, args.older_than))
    except (FlowForgeError, psycopg.Error) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(report.describe())
    return EXIT_OK
