"""Creating a run of a 200-item ``forEach`` beside a run of a 200-task static definition.

Both definitions have a root, N parallel tasks after it and a sink after those, one
compensator per middle task: the static one declares the N tasks (and N compensators), the
``forEach`` one declares one task over a list parameter of N items (and one compensator,
which becomes N). ``create_run`` (the operator's one transaction, ``expand`` included) is
timed for each, alternately, ``--rounds`` times; the medians and their ratio are printed
(forEach / static: at most about 1 means a fan-out costs no more than writing it out).

Starts PostgreSQL 15 from the machine's binaries in a temporary directory, or uses
``--dsn`` / ``FLOWFORGE_BENCH_DSN`` (the database is migrated; the rows are left).

    .venv/bin/python bench/bench_for_each.py [--items 200] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

from flowforge.domain.validation import parse_definition
from flowforge.store.connection import Pool
from flowforge.store.definitions import StoredDefinition, load_definition, publish_definition
from flowforge.store.lease import Fence, acquire_lease
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool
from flowforge.store.runs import create_run
from harness.cluster import local_postgres

NAMESPACE = "bench"


def _static(items: int) -> dict[str, Any]:
    middle = [f"deploy-{n}" for n in range(items)]
    return {
        "tasks": [
            {"key": "root", "type": "py"},
            *({"key": key, "type": "py", "dependsOn": ["root"]} for key in middle),
            {"key": "sink", "type": "py", "dependsOn": middle},
            *({"key": f"undo-{key}", "type": "py", "compensateFor": key} for key in middle),
        ]
    }


def _for_each(items: int) -> dict[str, Any]:
    regions = [f"r{n}" for n in range(items)]
    return {
        "parameters": [{"name": "regions", "type": "array", "default": regions, "maxItems": 256}],
        "tasks": [
            {"key": "root", "type": "py"},
            {
                "key": "deploy",
                "type": "py",
                "dependsOn": ["root"],
                "forEach": {"items": "params.regions"},
            },
            {"key": "sink", "type": "py", "dependsOn": ["deploy"]},
            {"key": "undo-deploy", "type": "py", "compensateFor": "deploy"},
        ],
    }


async def _publish(pool: Pool, workflow: str, shape: dict[str, Any]) -> StoredDefinition:
    spec = parse_definition(
        {
            "workflow": workflow,
            "version": 1,
            "taskTypes": {"py": {"image": "python:3.12-slim"}},
            **shape,
        }
    )
    await publish_definition(pool, namespace=NAMESPACE, definition=spec)
    return await load_definition(pool, namespace=NAMESPACE, workflow=workflow, version=1)


async def _create_ms(pool: Pool, fence: Fence, definition: StoredDefinition) -> float:
    started = time.perf_counter()
    await create_run(
        pool,
        fence=fence,
        namespace=NAMESPACE,
        name=f"run-{uuid.uuid4().hex[:10]}",
        uid=str(uuid.uuid4()),
        definition=definition,
    )
    return (time.perf_counter() - started) * 1000


async def _bench(dsn: str, *, items: int, rounds: int) -> None:
    await migrate(dsn)
    pool = await open_pool(dsn, min_size=1, max_size=2)
    try:
        lease = await acquire_lease(pool, holder=f"bench-{os.getpid()}", ttl=timedelta(hours=1))
        if lease is None:
            raise SystemExit("the operator lease is held by someone else")
        label = uuid.uuid4().hex[:6]
        static = await _publish(pool, f"static-{label}", _static(items))
        fanned = await _publish(pool, f"foreach-{label}", _for_each(items))
        for definition in (static, fanned):  # warm: caches, plans
            await _create_ms(pool, lease.fence, definition)
        static_ms: list[float] = []
        fanned_ms: list[float] = []
        for _ in range(rounds):
            static_ms.append(await _create_ms(pool, lease.fence, static))
            fanned_ms.append(await _create_ms(pool, lease.fence, fanned))
        static_median = statistics.median(static_ms)
        fanned_median = statistics.median(fanned_ms)
        print(
            f"create_run, {items} parallel tasks with compensators: static "
            f"{static_median:.1f} ms, forEach {fanned_median:.1f} ms, ratio "
            f"{fanned_median / static_median:.2f} (medians of {rounds} interleaved rounds)"
        )
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("FLOWFORGE_BENCH_DSN"))
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    def bench(dsn: str) -> None:
        asyncio.run(_bench(dsn, items=args.items, rounds=args.rounds))

    if args.dsn:
        bench(args.dsn)
        return
    with local_postgres() as dsn:
        bench(dsn)


if __name__ == "__main__":
    main()
