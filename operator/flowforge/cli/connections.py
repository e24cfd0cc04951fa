"""How commands reach the read API server (``--server``, see ``api_client``), the store
(``--dsn``, or ``$FLOWFORGE_DSN``: the admin mode, which a command that also reads through
the server enters only when asked, ``--admin`` or ``--dsn``: a DSN in the environment alone
never bypasses the server's RBAC), ``--kubeconfig`` (or ``$KUBECONFIG``), ``-n/--namespace``
(default: the kubeconfig context's namespace, else ``default``)."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from flowforge.cli.api_client import SERVER_VARIABLE, ServerClient, configured_server
from flowforge.cli.commands import DSN_VARIABLE
from flowforge.cli.output import EXIT_USAGE, CommandError, exit_code_for, first_line
from flowforge.domain.errors import FlowForgeError
from flowforge.store.connection import Pool
from flowforge.store.pool import open_pool

T = TypeVar("T")


def server_client(args: argparse.Namespace) -> ServerClient | None:
    """The read API server to go through, unless this is the admin mode (``--admin`` or
    ``--dsn``) or no server is configured."""
    if getattr(args, "admin", False) or getattr(args, "dsn", None):
        return None
    url = configured_server(args)
    return None if url is None else ServerClient.from_args(args, url)


def require_reader(args: argparse.Namespace) -> None:
    """Fail with how to configure one when there is neither a server nor a store."""
    if not has_store(args):
        raise CommandError(
            f"no server configured: pass --server URL or set {SERVER_VARIABLE} (as an "
            f"administrator: pass --dsn, or --admin with {DSN_VARIABLE} set)"
            + _ignored_variable(args),
            exit_code=EXIT_USAGE,
        )


def _environment_dsn(args: argparse.Namespace) -> str | None:
    """``$FLOWFORGE_DSN``, where it counts: always for the administrators' commands (``db``,
    ``doctor``, ``retry``), and only with ``--admin`` for those that read through the server."""
    return os.environ.get(DSN_VARIABLE) if getattr(args, "admin", True) else None


def _ignored_variable(args: argparse.Namespace) -> str:
    if os.environ.get(DSN_VARIABLE) and _environment_dsn(args) is None:
        return f"; {DSN_VARIABLE} is set, and is read only with --admin"
    return ""


def has_store(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "dsn", None) or _environment_dsn(args))


def store_dsn(args: argparse.Namespace) -> str:
    dsn = getattr(args, "dsn", None) or _environment_dsn(args)
    if not dsn:
        raise CommandError(
            f"no database: pass --dsn or set {DSN_VARIABLE}" + _ignored_variable(args),
            exit_code=EXIT_USAGE,
        )
    return str(dsn)


def resolve_namespace(args: argparse.Namespace) -> str:
    if getattr(args, "namespace", None):
        return str(args.namespace)
    try:
        _, active = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=getattr(args, "kubeconfig", None)
        )
    except (k8s_config.ConfigException, OSError, TypeError):
        return "default"
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


def kube_client(args: argparse.Namespace) -> k8s.ApiClient:
    try:
        api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=getattr(args, "kubeconfig", None)
        )
    except (k8s_config.ConfigException, OSError) as error:
        raise CommandError(f"cannot load the kubeconfig: {error}", exit_code=EXIT_USAGE) from error
    return api


async def _with_pool(dsn: str, work: Callable[[Pool], Awaitable[T]]) -> T:
    pool = await open_pool(dsn, min_size=1, max_size=2, name="flowforge-cli")
    try:
        return await work(pool)
    finally:
        await pool.close()


def with_store(args: argparse.Namespace, work: Callable[[Pool], Awaitable[T]]) -> T:
    """``work`` on a small pool of the store; its failures say "store:" and keep their blame."""
    dsn = store_dsn(args)
    try:
        return asyncio.run(_with_pool(dsn, work))
    except (FlowForgeError, psycopg.Error) as error:
        raise CommandError(
            f"store: {first_line(error)}", exit_code=exit_code_for(error) or 1
        ) from error
