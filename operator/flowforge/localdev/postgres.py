"""An embedded PostgreSQL 15 server for tests and ``make dev``, from the machine's binaries.

``up`` runs ``initdb`` once in ``DIR/data`` and starts the server with ``pg_ctl`` listening
on 127.0.0.1 (a free port) and on a unix socket in ``DIR``; it prints a DSN. ``down`` stops
it. PostgreSQL refuses to run as root, so when we are root the server runs as the
unprivileged ``postgres`` account (created as ``flowforge-pg`` when no such account exists)
and ``DIR`` is handed to it; every parent of ``DIR`` must be traversable by that account.

    python -m flowforge.localdev.postgres up --dir DIR
    python -m flowforge.localdev.postgres down --dir DIR

``provision`` (``make dev``) gives each FlowForge component its own login role, a member of
its group role (``flowforge.store.roles``), and a ``flowforge`` database owned by the
migrator's login, so migrations run as the migrator from the first one on; it returns a DSN
per component. The server trusts local connections, so the logins need no password.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from flowforge.store import roles

SUPERUSER = "postgres"
DEV_DATABASE = "flowforge"
# component -> (its login role, the group role it is a member of)
COMPONENT_LOGINS: dict[str, tuple[str, str]] = {
    "migrator": ("ff_migrator", roles.MIGRATOR),
    "operator": ("ff_operator", roles.OPERATOR),
    "webhook": ("ff_webhook", roles.WEBHOOK),
    "retention": ("ff_retention", roles.RETENTION),
    "reporting": ("ff_reporting", roles.REPORTING),
    "server": ("ff_server", roles.SERVER),
}
FALLBACK_SERVICE_ACCOUNT = "flowforge-pg"
BINARY_DIRECTORIES = (Path("/usr/lib/postgresql/15/bin"),)
DSN_FILE = "dsn"
START_ATTEMPTS = 3


class PostgresSetupError(RuntimeError):
    """The local server could not be found, initialised or started; the message says why."""


@dataclasses.dataclass(frozen=True)
class LocalPostgres:
    directory: Path
    port: int
    dsn: str

    @property
    def data_directory(self) -> Path:
        return self.directory / "data"


def find_binary(name: str) -> Path:
    for directory in BINARY_DIRECTORIES:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    on_path = shutil.which(name)
    if on_path is not None:
        return Path(on_path)
    raise PostgresSetupError(
        f"PostgreSQL binary {name!r} not found in {[str(d) for d in BINARY_DIRECTORIES]} "
        "or on PATH; install PostgreSQL 15 (Debian: apt-get install postgresql-15)"
    )


def _service_account() -> pwd.struct_passwd | None:
    """The account the server runs as, or None to run as ourselves (we are not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", FALLBACK_SERVICE_ACCOUNT):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(
        [
            "useradd",
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            FALLBACK_SERVICE_ACCOUNT,
        ],
        check=True,
    )
    return pwd.getpwnam(FALLBACK_SERVICE_ACCOUNT)


def _run_as_server_account(
    command: Sequence[str], *, account: pwd.struct_passwd | None, cwd: Path
) -> subprocess.CompletedProcess[str]:
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    if account is None:
        return subprocess.run(
            list(command), cwd=cwd, env=environment, capture_output=True, text=True
        )
    environment["HOME"] = str(cwd)
    environment["USER"] = account.pw_name
    return subprocess.run(
        list(command),
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=[],
    )


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise PostgresSetupError(f"{what} failed ({result.returncode}): {result.stderr.strip()}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _dsn(port: int, database: str = "postgres") -> str:
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{database}"


def _prepare_directory(directory: Path, account: pwd.struct_passwd | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if account is None:
        return
    os.chown(directory, account.pw_uid, account.pw_gid)
    blocked = [
        str(parent) for parent in directory.resolve().parents if not os.stat(parent).st_mode & 0o001
    ]
    if blocked:
        raise PostgresSetupError(
            f"{account.pw_name} cannot reach {directory}: no search permission on "
            f"{', '.join(blocked)}; pick a directory under /tmp"
        )


def _initdb(data_directory: Path, account: pwd.struct_passwd | None) -> None:
    result = _run_as_server_account(
        [
            str(find_binary("initdb")),
            "--pgdata",
            str(data_directory),
            "--username",
            SUPERUSER,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C.UTF-8",
        ],
        account=account,
        cwd=data_directory.parent,
    )
    _check(result, "initdb")


def _server_options(port: int, directory: Path, settings: Mapping[str, str]) -> str:
    options = {
        "port": str(port),
        "listen_addresses": "127.0.0.1",
        "unix_socket_directories": str(directory),
        "max_connections": "200",
        **settings,
    }
    return " ".join(f"-c {name}={value}" for name, value in options.items())


def start(directory: Path, *, settings: Mapping[str, str] | None = None) -> LocalPostgres:
    """Initialise (first time) and start the server in ``directory``; return how to reach it.

    ``settings`` are extra server settings, e.g. ``{"fsync": "off"}`` for throwaway test data.
    A server already running in ``directory`` is reused.
    """
    directory = directory.absolute()
    account = _service_account()
    _prepare_directory(directory, account)
    running = status(directory)
    if running is not None:
        return running
    data_directory = directory / "data"
    if not (data_directory / "PG_VERSION").exists():
        _initdb(data_directory, account)
    last_error = ""
    for _ in range(START_ATTEMPTS):
        port = _free_port()
        result = _run_as_server_account(
            [
                str(find_binary("pg_ctl")),
                "start",
                "--wait",
                "--timeout",
                "60",
                "--pgdata",
                str(data_directory),
                "--log",
                str(directory / "postgres.log"),
                "--options",
                _server_options(port, directory, settings or {}),
            ],
            account=account,
            cwd=directory,
        )
        if result.returncode == 0:
            server = LocalPostgres(directory=directory, port=port, dsn=_dsn(port))
            (directory / DSN_FILE).write_text(f"{server.dsn}\n")
            return server
        last_error = (result.stderr + _log_tail(directory)).strip()
    raise PostgresSetupError(f"pg_ctl start failed in {directory}: {last_error}")


def _log_tail(directory: Path) -> str:
    log = directory / "postgres.log"
    if not log.exists():
        return ""
    return "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-10:])


def status(directory: Path) -> LocalPostgres | None:
    """The server running in ``directory``, or None."""
    directory = directory.absolute()
    dsn_file = directory / DSN_FILE
    if not (directory / "data" / "postmaster.pid").exists() or not dsn_file.exists():
        return None
    dsn = dsn_file.read_text().strip()
    port = int(dsn.rsplit(":", 1)[1].split("/", 1)[0])
    if not _accepts_connections(port):
        return None
    return LocalPostgres(directory=directory, port=port, dsn=dsn)


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def stop(directory: Path) -> bool:
    """Stop the server in ``directory`` (fast shutdown); False if none was running."""
    directory = directory.absolute()
    data_directory = directory / "data"
    if not (data_directory / "postmaster.pid").exists():
        return False
    result = _run_as_server_account(
        [
            str(find_binary("pg_ctl")),
            "stop",
            "--wait",
            "--mode",
            "fast",
            "--pgdata",
            str(data_directory),
        ],
        account=_service_account(),
        cwd=directory,
    )
    _check(result, "pg_ctl stop")
    deadline = time.monotonic() + 10
    while (data_directory / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def _create_role(
    connection: psycopg.Connection[tuple[object, ...]], statement: sql.Composed
) -> None:
    # it may exist: roles are global to the server and outlive a database
    with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        connection.execute(statement)


def provision(admin_dsn: str, *, database: str = DEV_DATABASE) -> dict[str, str]:
    """Group roles, a login per component and the database (idempotent), through the
    superuser's ``admin_dsn``; returns component -> DSN."""
    migrator_login = COMPONENT_LOGINS["migrator"][0]
    with psycopg.connect(admin_dsn, autocommit=True) as connection:
        for group in roles.ALL_ROLES:
            _create_role(
                connection, sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(group))
            )
        # as migration 4 would (the server reads as reporting, narrowed per transaction)
        connection.execute(
            sql.SQL("GRANT {} TO {}").format(
                sql.Identifier(roles.REPORTING), sql.Identifier(roles.SERVER)
            )
        )
        for login, group in COMPONENT_LOGINS.values():
            _create_role(connection, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
            connection.execute(
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(login))
            )
        exists = connection.execute(
            "SELECT FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
        if exists is None:
            connection.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(database), sql.Identifier(migrator_login)
                )
            )
    return {
        component: make_conninfo(admin_dsn, user=login, dbname=database)
        for component, (login, _group) in COMPONENT_LOGINS.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowforge.localdev.postgres")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--dir", required=True, type=Path, help="server directory")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            print(start(args.dir).dsn)
            return 0
        if args.action == "down":
            stopped = stop(args.dir)
            print("stopped" if stopped else "not running")
            return 0
        running = status(args.dir)
        print(running.dsn if running else "not running")
        return 0 if running else 1
    except PostgresSetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
