"""The store's live outcome path beside pgbench on the same server, in one run, interleaved.

Prints outcomes per second beside the commits this PostgreSQL manages at all (pgbench).

The outcome path is the operator's own (``store.outcomes.record_outcome``, as
``operator.engine`` calls it for a finished Job): one fenced statement that records the
success, releases the dependent and moves it on to running (its Job to create comes back in
the ``Decision``), then nothing else, since a released task is unresolved and whoever
resolves it settles the run. Each writer drives its own run of N pairs ``root-i -> child-i``
(the operator's concurrency comes from many runs at once); the roots are dispatched first
(``dispatch_due``, one statement), then each writer records its roots' successes one after
another, and every decision must dispatch exactly the root's child.

The baseline is pgbench's built-in TPC-B-like transaction (5 statements, one commit) with
as many clients as writers, on the same server. The two alternate ``--rounds`` times for
each writer count, so both see the same machine state; the medians and their ratio are
printed (how close an outcome comes to what this machine's PostgreSQL commits at all).

Starts PostgreSQL 15 from the machine's binaries in a temporary directory with default
durability (fsync on, synchronous_commit on), or uses ``--dsn`` / ``FLOWFORGE_BENCH_DSN``
(the database is migrated, and pgbench's tables are created in it; the rows are left).

    .venv/bin/python bench/bench_store.py [--pairs 2000] [--writers 1 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

from flowforge.domain.decision import JobRef
from flowforge.domain.execution import AttemptOutcome, BackoffPolicy, OutcomeReason
from flowforge.domain.validation import parse_definition
from flowforge.localdev import postgres as localdev
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.dispatch import dispatch_due
from flowforge.store.lease import Fence, acquire_lease
from flowforge.store.migrate import migrate
from flowforge.store.outcomes import record_outcome
from flowforge.store.pool import open_pool
from flowforge.store.runs import RunRecord, create_run
from harness.cluster import local_postgres

NAMESPACE = "bench"
SUCCESS = AttemptOutcome(succeeded=True, reason=OutcomeReason.COMPLETED, exit_code=0)


@dataclass(frozen=True)
class OutcomeRound:
    rate: float  # outcomes per second, all writers together
    p50_ms: float  # one record_outcome call, median


async def _prepare_run(pool: Pool, fence: Fence, *, pairs: int, label: str) -> RunRecord:
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
    created = await create_run(
        pool, fence=fence, namespace=NAMESPACE, name=label, uid=str(uuid.uuid4()), definition=stored
    )
    dispatched = await dispatch_due(pool, fence=fence, run_id=created.run.id)
    if len(dispatched.create_jobs) != pairs:
        raise SystemExit(f"expected {pairs} roots dispatched, saw {len(dispatched.create_jobs)}")
    return created.run


async def measure_outcomes(
    pool: Pool, fence: Fence, *, writers: int, pairs_per_run: int, label: str
) -> OutcomeRound:
    """``writers`` runs, one writer each, record every root's success."""
    runs = [
        await _prepare_run(pool, fence, pairs=pairs_per_run, label=f"{label}-{index}")
        for index in range(writers)
    ]
    latencies: list[float] = []

    async def writer(run: RunRecord) -> None:
        for n in range(pairs_per_run):
            began = time.perf_counter()
            decision = await record_outcome(
                pool,
                fence=fence,
                run_id=run.id,
                run_uid=run.uid,
                job=JobRef(task_key=f"root-{n}", attempt=1),
                outcome=SUCCESS,
                backoff=BackoffPolicy(),
            )
            latencies.append(time.perf_counter() - began)
            if [d.task_key for d in decision.create_jobs] != [f"child-{n}"]:
                raise SystemExit(f"root-{n}: expected child-{n} dispatched, got {decision}")

    started = time.perf_counter()
    await asyncio.gather(*(writer(run) for run in runs))
    elapsed = time.perf_counter() - started
    return OutcomeRound(rate=len(latencies) / elapsed, p50_ms=statistics.median(latencies) * 1000)


def _pgbench() -> str:
    return str(localdev.find_binary("pgbench"))


def pgbench_initialize(dsn: str) -> None:
    subprocess.run(
        [_pgbench(), "--initialize", "--quiet", "--scale=4", dsn],
        check=True,
        capture_output=True,
        text=True,
    )


def pgbench_tps(dsn: str, *, clients: int, seconds: int) -> float:
    """Transactions per second of pgbench's default script on the same server."""
    result = subprocess.run(
        [
            _pgbench(),
            f"--client={clients}",
            f"--jobs={min(clients, 2)}",
            f"--time={seconds}",
            "--no-vacuum",
            dsn,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    if match is None:
        raise SystemExit(f"pgbench printed no tps:\n{result.stdout}{result.stderr}")
    return float(match.group(1))


async def _bench(
    dsn: str, *, pairs: int, writer_counts: list[int], rounds: int, pgbench_seconds: int
) -> None:
    await migrate(dsn)
    await asyncio.to_thread(pgbench_initialize, dsn)
    pool = await open_pool(dsn, min_size=max(writer_counts), max_size=max(writer_counts))
    try:
        lease = await acquire_lease(pool, holder=f"bench-{os.getpid()}", ttl=timedelta(hours=1))
        if lease is None:
            raise SystemExit("the operator lease is held by someone else")
        label = f"bench-{uuid.uuid4().hex[:8]}"
        summary: list[str] = []
        for writers in writer_counts:
            outcome_rounds: list[OutcomeRound] = []
            baselines: list[float] = []
            for number in range(1, rounds + 1):
                measured = await measure_outcomes(
                    pool,
                    lease.fence,
                    writers=writers,
                    pairs_per_run=max(1, pairs // writers),
                    label=f"{label}-w{writers}-r{number}",
                )
                outcome_rounds.append(measured)
                baseline = await asyncio.to_thread(
                    pgbench_tps, dsn, clients=writers, seconds=pgbench_seconds
                )
                baselines.append(baseline)
                print(
                    f"writers={writers} round {number}: {measured.rate:,.0f} outcomes/s "
                    f"(p50 {measured.p50_ms:.2f} ms), pgbench {baseline:,.0f} tps",
                    flush=True,
                )
            rate = statistics.median(r.rate for r in outcome_rounds)
            p50 = statistics.median(r.p50_ms for r in outcome_rounds)
            baseline = statistics.median(baselines)
            summary.append(
                f"writers={writers}: live outcome path {rate:,.0f}/s (p50 {p50:.2f} ms), "
                f"pgbench TPC-B {baseline:,.0f} tps, ratio {rate / baseline:.2f} "
                f"(medians of {rounds} interleaved rounds)"
            )
        print("\n".join(summary))
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("FLOWFORGE_BENCH_DSN"))
    parser.add_argument(
        "--pairs", type=int, default=2000, help="outcomes per round, split across the writers"
    )
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per writer count")
    parser.add_argument(
        "--pgbench-seconds", type=int, default=5, help="length of each pgbench round"
    )
    args = parser.parse_args()

    def bench(dsn: str) -> None:
        asyncio.run(
            _bench(
                dsn,
                pairs=args.pairs,
                writer_counts=args.writers,
                rounds=args.rounds,
                pgbench_seconds=args.pgbench_seconds,
            )
        )

    if args.dsn:
        bench(args.dsn)
        return
    with local_postgres() as dsn:
        print("local PostgreSQL 15, default durability (fsync on)", flush=True)
        bench(dsn)


if __name__ == "__main__":
    main()
