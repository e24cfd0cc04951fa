"""Outcome transactions per second: record an outcome and release its dependent.

Starts PostgreSQL 15 from the machine's binaries in a temporary directory with default
durability (fsync on, synchronous_commit on), or uses ``--dsn`` / ``FLOWFORGE_BENCH_DSN``
(the database is migrated; the bench's rows are left in it). For each writer count, one
run holds N independent pairs ``root-i -> child-i``; every root is marked running first,
then the writers record the roots' successes concurrently. Each ``record_outcome`` is one
fenced compare-and-set transaction that also releases the child and appends the events,
followed by the run-settle probe. Prints transactions per second for 1 and 4 writers;
then the same for the operator's own outcome path (``store.engine.record_outcome``: the
same one statement, which also moves the released child on to running, then the settle
probe), one run per writer;
and, as the baseline measured on the same server in the same run, pgbench's built-in
TPC-B-like transaction (5 statements, one commit) with as many clients: the ratio says how
close an outcome comes to what this machine's PostgreSQL commits at all.

    .venv/bin/python bench/bench_store.py [--pairs 2000] [--writers 1 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from flowforge.domain.execution import AttemptOutcome, BackoffPolicy, OutcomeReason
from flowforge.domain.validation import parse_definition
from flowforge.localdev import postgres as localdev
from flowforge.store import engine as store_engine
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.lease import Fence, acquire_lease
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool
from flowforge.store.runs import create_run
from flowforge.store.transitions import mark_running, record_outcome

NAMESPACE = "bench"


async def _prepare_run(pool: Pool, fence: Fence, *, pairs: int, label: str) -> tuple[int, str]:
    tasks: list[dict[str, object]] = []
    for n in range(pairs):
        tasks.append({"key": f"root-{n}", "type": "py"})
        tasks.append({"key": f"child-{n}", "type": "py", "dependsOn": [f"root-{n}"]})
    spec = parse_definition(
        {
            "workflow": label,
            "version": 1,
            "taskTypes": {"py": {"image": "python:3.12-slim"}},
            "tasks": tasks,
        }
    )
    await publish_definition(pool, namespace=NAMESPACE, definition=spec)
    stored = await load_definition(pool, namespace=NAMESPACE, workflow=label, version=1)
    run = await create_run(
        pool,
        fence=fence,
        namespace=NAMESPACE,
        name=label,
        uid=str(uuid.uuid4()),
        definition=stored,
    )
    for n in range(pairs):
        await mark_running(pool, fence=fence, run_id=run.run.id, task_key=f"root-{n}", attempt=1)
    return run.run.id, run.run.uid


async def _measure_engine_path(
    pool: Pool, fence: Fence, *, runs: list[tuple[int, str]], pairs_per_run: int
) -> float:
    """The operator's own outcome path (store.engine.record_outcome: one statement that also
    dispatches the released child). One writer per run, as the operator's concurrency comes
    from many runs at once."""
    success = AttemptOutcome(succeeded=True, reason=OutcomeReason.COMPLETED)
    dispatched = 0

    async def writer(run_id: int, run_uid: str) -> None:
        nonlocal dispatched
        for n in range(pairs_per_run):
            decision = await store_engine.record_outcome(
                pool,
                fence=fence,
                run_id=run_id,
                run_uid=run_uid,
                task_key=f"root-{n}",
                attempt=1,
                outcome=success,
                backoff=BackoffPolicy(),
            )
            dispatched += len(decision.dispatched)

    started = time.perf_counter()
    await asyncio.gather(*(writer(run_id, uid) for run_id, uid in runs))
    elapsed = time.perf_counter() - started
    total = pairs_per_run * len(runs)
    if dispatched != total:
        raise SystemExit(f"expected {total} dispatches, saw {dispatched}")
    return total / elapsed


async def _measure(pool: Pool, fence: Fence, *, run_id: int, pairs: int, writers: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(pairs):
        queue.put_nowait(n)
    released = 0

    async def writer() -> None:
        nonlocal released
        while not queue.empty():
            n = queue.get_nowait()
            result = await record_outcome(
                pool, fence=fence, run_id=run_id, task_key=f"root-{n}", attempt=1, succeeded=True
            )
            released += len(result.released)

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - started
    if released != pairs:
        raise SystemExit(f"expected {pairs} releases, saw {released}")
    return pairs / elapsed


async def _bench(dsn: str, *, pairs: int, writer_counts: list[int]) -> dict[int, float]:
    await migrate(dsn)
    pool = await open_pool(dsn, min_size=max(writer_counts), max_size=max(writer_counts))
    try:
        lease = await acquire_lease(pool, holder=f"bench-{os.getpid()}", ttl=timedelta(hours=1))
        if lease is None:
            raise SystemExit("the operator lease is held by someone else")
        label = uuid.uuid4().hex[:8]
        rates: dict[int, float] = {}
        for writers in writer_counts:
            run_id, _ = await _prepare_run(
                pool, lease.fence, pairs=pairs, label=f"bench-{label}-{writers}"
            )
            rate = await _measure(pool, lease.fence, run_id=run_id, pairs=pairs, writers=writers)
            rates[writers] = rate
            print(
                f"writers={writers}: {rate:,.0f} outcome transactions/s "
                f"({pairs} outcomes, each releasing one dependent)"
            )
            runs = [
                await _prepare_run(
                    pool,
                    lease.fence,
                    pairs=pairs // writers,
                    label=f"bench-{label}-engine-{writers}-{index}",
                )
                for index in range(writers)
            ]
            engine_rate = await _measure_engine_path(
                pool, lease.fence, runs=runs, pairs_per_run=pairs // writers
            )
            print(
                f"writers={writers}: {engine_rate:,.0f} operator outcome transactions/s "
                f"(store.engine path, {writers} run(s), one writer each)"
            )
    finally:
        await pool.close()
    return rates


def pgbench_baseline(dsn: str, *, clients: int, seconds: int = 10) -> float:
    """Transactions per second of pgbench's default script on the same server."""
    pgbench = str(localdev.find_binary("pgbench"))
    subprocess.run(
        [pgbench, "--initialize", "--quiet", "--scale=4", dsn],
        check=True,
        capture_output=True,
        text=True,
    )
    result = subprocess.run(
        [pgbench, f"--client={clients}", f"--jobs={min(clients, 2)}", f"--time={seconds}", dsn],
        check=True,
        capture_output=True,
        text=True,
    )
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    if match is None:
        raise SystemExit(f"pgbench printed no tps:\n{result.stdout}{result.stderr}")
    return float(match.group(1))


def _print_baselines(dsn: str, rates: dict[int, float]) -> None:
    for writers, rate in rates.items():
        baseline = pgbench_baseline(dsn, clients=writers)
        print(
            f"writers={writers}: pgbench baseline {baseline:,.0f} tps on the same server; "
            f"outcome/pgbench ratio {rate / baseline:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("FLOWFORGE_BENCH_DSN"))
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    if args.dsn:
        asyncio.run(_bench(args.dsn, pairs=args.pairs, writer_counts=args.writers))
        return
    directory = Path(tempfile.mkdtemp(prefix="flowforge-bench-pg-"))
    try:
        server = localdev.start(directory)
        print(f"local PostgreSQL 15 in {directory}, default durability (fsync on)")
        rates = asyncio.run(_bench(server.dsn, pairs=args.pairs, writer_counts=args.writers))
        _print_baselines(server.dsn, rates)
    finally:
        localdev.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
