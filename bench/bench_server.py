"""What the read API's reads of a 10,000-task run cost, beside the bare read of its rows.

Creates one run of a layered 10,000-task definition in a fresh store and reads it as the
``flowforge_server`` role (row-level security on, scoped per transaction) the way the server
does: the run detail (tasks omitted above 2,000), the graph with every state, one task's
detail, the stream's change probe, and a page of the run list. The baseline is the plainest
read of the same data: ``SELECT task_key, state`` of the run's rows as the schema's owner.
The graph is the server's answer as sent (pre-serialised JSON, its definition's part cached).
The cases alternate ``--rounds`` times; the medians and the ratio to the baseline are printed.
HTTP, JSON encoding by uvicorn and the reviews (cached) are not included.

``--owner`` reads as the schema's owner instead, which row-level security exempts.

Starts PostgreSQL 15 from the machine's binaries in a temporary directory.

    .venv/bin/python bench/bench_server.py [--tasks 10000] [--rounds 5] [--owner]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from flowforge.domain.validation import parse_definition
from flowforge.server import reads
from flowforge.server.state import ServerState
from flowforge.store import browse, roles
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.dispatch import dispatch_due
from flowforge.store.lease import acquire_lease
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool
from flowforge.store.runs import create_run
from harness.cluster import local_postgres

NAMESPACE = "bench"
LOGIN = "ff_bench_server"


def layered(tasks: int, width: int = 100) -> dict[str, Any]:
    """``tasks`` tasks in levels of ``width``, each depending on two of the level above."""
    specs: list[dict[str, Any]] = []
    for number in range(tasks):
        level, index = divmod(number, width)
        spec: dict[str, Any] = {"key": f"t{number}", "type": "step"}
        if level:
            above = (level - 1) * width
            spec["dependsOn"] = sorted({f"t{above + index}", f"t{above + (index + 1) % width}"})
        specs.append(spec)
    return {
        "workflow": "wide",
        "version": 1,
        "taskTypes": {"step": {"image": "busybox:1.36"}},
        "tasks": specs,
    }


async def timed(work: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await work()
    return time.perf_counter() - started


class _TheNamespace:
    """The apiserver's answer for the one namespace (its run has no uid recorded, so any uid
    shows it): the reads are timed, not the cluster."""

    async def namespace_uids(self, names: Sequence[str] | None = None) -> dict[str, str]:
        return {NAMESPACE: "bench"}

    def close(self) -> None:
        return


async def bench(admin_dsn: str, *, tasks: int, rounds: int, owner: bool) -> None:
    await migrate(admin_dsn)
    with psycopg.connect(admin_dsn, autocommit=True) as connection:
        with contextlib.suppress(psycopg.errors.DuplicateObject):
            connection.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(LOGIN), sql.Literal(LOGIN)
                )
            )
        connection.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(roles.SERVER), sql.Identifier(LOGIN))
        )
        connection.execute(
            "INSERT INTO flowforge_reporting_grant (grantee, namespace) VALUES (%s, '*')", (LOGIN,)
        )
    admin = await open_pool(admin_dsn, min_size=1, max_size=2)
    server_pool = await open_pool(
        make_conninfo(admin_dsn, user=LOGIN, password=LOGIN), min_size=1, max_size=2
    )
    await publish_definition(
        admin, namespace=NAMESPACE, definition=parse_definition(layered(tasks))
    )
    definition = await load_definition(admin, namespace=NAMESPACE, workflow="wide", version=1)
    lease = await acquire_lease(admin, holder="bench", ttl=timedelta(hours=1))
    assert lease is not None
    created = await create_run(
        admin,
        fence=lease.fence,
        namespace=NAMESPACE,
        name="wide-1",
        uid="u-1",
        definition=definition,
    )
    await dispatch_due(admin, fence=lease.fence, run_id=created.run.id)
    state = ServerState(
        pool=admin if owner else server_pool,
        reviews=_TheNamespace(),
        authenticator=None,  # type: ignore[arg-type]
        authorizer=None,  # type: ignore[arg-type]
        user_api=None,  # type: ignore[arg-type]
    )

    async def baseline() -> None:
        async with admin.connection() as connection:
            cursor = await connection.execute(
                "SELECT task_key, state FROM flowforge_task WHERE run_id = %s", (created.run.id,)
            )
            await cursor.fetchall()

    async def detail() -> None:
        async with state.reader([NAMESPACE]) as connection:
            shown = await reads.detail(state, connection, namespace=NAMESPACE, name="wide-1")
        shown.model_dump_json(by_alias=True)

    async def graph() -> None:
        async with state.reader([NAMESPACE]) as connection:
            drawn = await reads.graph(state, connection, namespace=NAMESPACE, name="wide-1")
        assert drawn.count(b'"level":') == tasks

    async def task() -> None:
        async with state.reader([NAMESPACE]) as connection:
            await reads.task(
                state, connection, namespace=NAMESPACE, name="wide-1", task=f"t{tasks // 2}"
            )

    async def probe() -> None:
        async with state.reader([NAMESPACE]) as connection:
            await browse.change_marker(connection, created.run.id)

    async def page() -> None:
        async with state.reader([NAMESPACE]) as connection:
            await browse.list_runs(connection, namespaces=[NAMESPACE], limit=50)

    cases = {"baseline": baseline, "detail": detail, "graph": graph, "task": task}
    cases |= {"stream probe": probe, "runs page": page}
    await graph()  # the definition cache, as a running server has it
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, work in cases.items():
            samples[name].append(await timed(work))
    base = statistics.median(samples["baseline"])
    who = "the owner, no row-level security" if owner else "flowforge_server, scoped"
    print(f"{tasks} tasks, {rounds} rounds, medians (as {who}):")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"  {name:<13} {median * 1000:8.1f} ms   {median / base:6.1f}x baseline")
    await admin.close()
    await server_pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--owner", action="store_true", help="read as the schema's owner (what RLS costs)"
    )
    args = parser.parse_args()
    with local_postgres() as server_dsn:
        dsn = make_conninfo(server_dsn, dbname="postgres")
        asyncio.run(bench(dsn, tasks=args.tasks, rounds=args.rounds, owner=args.owner))


if __name__ == "__main__":
    main()
