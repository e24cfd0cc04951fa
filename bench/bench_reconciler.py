"""Reconciler benchmark: one pass over many active runs (store rows, few Jobs), this code
against a baseline (main, from a ``git worktree``), on the same cluster and database.

Setup: N WorkflowRun objects in one namespace (FlowForge's finalizer already on them) and
their runs in PostgreSQL, made by the store's own moves: each run's task failed once and
waits for its retry a day later (a run that is active and has no Job); K more runs have a
task released now, so the first pass creates their Jobs (kwok completes them).

Each measurement is a fresh process (``--child``) with the code under test on its
``PYTHONPATH``: a leading Engine and Reconciler on a real KubeClient and a pool, that runs a
warm-up pass (it catches up: statuses, the K runs' Jobs) and then timed passes. Per pass it
prints the pass time, the time until the status writes it caused were sent, the SQL
statements executed (``pg_stat_statements``, the lease's renewals included) and the API
calls made (counted at the engine's Kubernetes port), by kind. Children alternate: this
code, the baseline, this code.

Target (issue 3/6): a pass over 10,000 active runs under 10 s. Usage:

    .venv/bin/python bench/bench_reconciler.py [--runs 10000] [--with-jobs 20]
        [--baseline main | --no-baseline] [--passes 2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from kubernetes import client as k8s

from flowforge.domain.api import FINALIZER
from harness.cluster import BenchEnvironment, baseline_checkout, bench_environment, exit_on_sigterm
from harness.runs import create_run_object

WORKFLOW = "idle"
REPO_OPERATOR = Path(__file__).resolve().parent.parent / "operator"


class CountingKube:
    """The engine's Kubernetes port, counting every call by name."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await target(*args, **kwargs)

        return counted


def statements(dsn: str, *, reset: bool) -> int:
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE query NOT ILIKE '%pg_stat_statements%'"
        ).fetchone()
        if reset:
            connection.execute("SELECT pg_stat_statements_reset()")
    return int(row[0]) if row else 0


async def child(args: argparse.Namespace) -> int:
    from flowforge.kube.client import KubeClient
    from flowforge.operator.engine import Engine
    from flowforge.operator.leadership import Leadership
    from flowforge.operator.reconciler import Reconciler
    from flowforge.operator.settings import OperatorSettings
    from flowforge.store.pool import open_pool

    settings = OperatorSettings(
        dsn=args.dsn,
        namespaces=(args.namespace,),
        kubeconfig=args.kubeconfig,
        identity=f"bench-{os.getpid()}",
    )
    pool = await open_pool(args.dsn, min_size=2, max_size=8, verify_schema=False)
    kube = CountingKube(
        KubeClient.connect(
            kubeconfig=args.kubeconfig,
            api_qps=settings.kube_api_qps,
            api_burst=settings.kube_api_burst,
        )
    )
    leadership = Leadership(
        pool, identity=settings.identity, ttl=timedelta(seconds=10), renew_every=3
    )
    leading = asyncio.create_task(leadership.run())
    await asyncio.wait_for(leadership.wait_until_leader(), timeout=60)
    engine = Engine(pool=pool, kube=kube, settings=settings, leadership=leadership)  # type: ignore[arg-type]
    reconciler = Reconciler(engine, interval=3600)
    try:
        for number in range(args.passes):
            statements(args.dsn, reset=True)
            kube.calls.clear()
            started = time.perf_counter()
            await reconciler.pass_once()
            passed = time.perf_counter() - started
            print(  # to the child's log in the work directory, before the status writes end
                f"pass {number}: {passed:.2f} s, {engine.status.pending()} status writes pending",
                file=sys.stderr,
                flush=True,
            )
            await drained(engine, kube)
            written = time.perf_counter() - started - 1.0  # the quiet second drained waits
            print(
                json.dumps(
                    {
                        "pass": number,
                        "seconds": passed,
                        "with_status_writes": max(passed, written),
                        "queries": statements(args.dsn, reset=False),
                        "api": dict(kube.calls),
                    }
                ),
                flush=True,
            )
    finally:
        await engine.shutdown()
        await leadership.release()
        leading.cancel()
        await pool.close()
    return 0


async def drained(engine: Any, kube: CountingKube) -> None:
    """Until the status writer has nothing marked and no status patch went out for 1 s."""
    quiet_since, seen = time.perf_counter(), -1
    while True:
        await asyncio.sleep(0.1)
        patches = kube.calls["patch_run_status"]
        if patches != seen or engine.status._dirty:
            quiet_since, seen = time.perf_counter(), patches
        elif time.perf_counter() - quiet_since >= 1.0:
            return


def create_objects(env: BenchEnvironment, count: int, prefix: str) -> list[tuple[str, str]]:
    custom = k8s.CustomObjectsApi(env.api)
    made: list[tuple[str, str]] = []
    lock = threading.Lock()
    names = [f"{prefix}-{n:05d}" for n in range(count)]

    def create(chunk: list[str]) -> None:
        for name in chunk:
            body = create_run_object(
                custom, env.namespace, name, workflow=WORKFLOW, finalizers=[FINALIZER]
            )
            with lock:
                made.append((name, body["metadata"]["uid"]))

    threads = [threading.Thread(target=create, args=(names[i::16],)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(made)


async def populate(env: BenchEnvironment, *, idle: int, with_jobs: int) -> None:
    from flowforge.domain.decision import JobRef
    from flowforge.domain.execution import AttemptOutcome, BackoffPolicy, OutcomeReason
    from flowforge.domain.validation import parse_definition
    from flowforge.store.definitions import load_definition, publish_definition
    from flowforge.store.dispatch import dispatch_due
    from flowforge.store.lease import acquire_lease, release_lease
    from flowforge.store.outcomes import record_outcome
    from flowforge.store.pool import open_pool
    from flowforge.store.runs import create_run

    pool = await open_pool(env.dsn, min_size=1, max_size=8)
    spec = {
        "workflow": WORKFLOW,
        "version": 1,
        "taskTypes": {"step": {"image": "busybox:1.36"}},
        "tasks": [{"key": "t", "type": "step", "retries": 1}],
    }
    await publish_definition(pool, namespace=env.namespace, definition=parse_definition(spec))
    definition = await load_definition(pool, namespace=env.namespace, workflow=WORKFLOW, version=1)
    lease = await acquire_lease(pool, holder="bench-setup", ttl=timedelta(hours=1))
    assert lease is not None
    fence = lease.fence
    # the cap too: the default caps a backoff at 5 minutes, after which every idle run's
    # retry would be due and the pass would create 10,000 Jobs
    later = BackoffPolicy(first_delay_seconds=86_400.0, cap_seconds=86_400.0, jitter=0.0)
    failed = AttemptOutcome(succeeded=False, reason=OutcomeReason.JOB_FAILED, message="bench")
    started = time.monotonic()
    objects = create_objects(env, idle, "idle") + create_objects(env, with_jobs, "busy")
    print(f"setup: {len(objects)} WorkflowRun objects in {time.monotonic() - started:.0f} s")
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    for item in objects:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            name, uid = queue.get_nowait()
            run = await create_run(
                pool,
                fence=fence,
                namespace=env.namespace,
                name=name,
                uid=uid,
                definition=definition,
            )
            if name.startswith("busy"):
                continue  # its task is released now: the first pass creates its Job
            await dispatch_due(pool, fence=fence, run_id=run.run.id)
            await record_outcome(
                pool,
                fence=fence,
                run_id=run.run.id,
                run_uid=uid,
                job=JobRef("t", 1),
                outcome=failed,
                backoff=later,
            )

    await asyncio.gather(*(worker() for _ in range(8)))
    await release_lease(pool, lease)
    await pool.close()
    print(f"setup: store rows in {time.monotonic() - started:.0f} s")


def run_child(
    env: BenchEnvironment, *, label: str, python_path: Path, passes: int
) -> list[dict[str, Any]]:
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            "--dsn",
            env.dsn,
            "--kubeconfig",
            str(env.kubeconfig),
            "--namespace",
            env.namespace,
            "--passes",
            str(passes),
        ],
        env={**os.environ, "PYTHONPATH": str(python_path)},
        stdout=subprocess.PIPE,
        stderr=(env.work / f"reconciler-{label.replace(' ', '-')}.log").open("ab"),
        text=True,
    )
    figures: list[dict[str, Any]] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:  # each pass's figures as soon as it is done
            if line.startswith("{"):
                figures.append(json.loads(line))
                print_pass(label, figures[-1])
    except BaseException:  # SIGTERM, a bad line: the child goes too
        process.kill()
        process.wait()
        raise
    if process.wait() != 0:
        raise SystemExit(f"{label} failed (exit {process.returncode}): see {env.work}")
    return figures


def print_pass(label: str, figure: dict[str, Any]) -> None:
    calls = ", ".join(f"{name} {n}" for name, n in sorted(figure["api"].items()))
    kind = "warm-up" if figure["pass"] == 0 else "steady"
    print(
        f"{label:>9} pass {figure['pass']} ({kind}): {figure['seconds']:7.2f} s, "
        f"{figure['with_status_writes']:7.2f} s with its status writes, "
        f"{figure['queries']:7d} SQL statements, "
        f"{sum(figure['api'].values()):6d} API calls ({calls})",
        flush=True,
    )


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000, help="idle active runs")
    parser.add_argument("--with-jobs", type=int, default=20, help="runs whose Job the pass makes")
    parser.add_argument("--baseline", default="main", help="git ref of the code to compare")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--passes", type=int, default=3, help="passes per child, warm-up included")
    parser.add_argument("--cluster-dir", type=Path, help="reuse a running local cluster")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return await child(args)

    async with bench_environment(
        cluster_dir=args.cluster_dir,
        postgres_settings={"shared_preload_libraries": "pg_stat_statements"},
    ) as env:
        with psycopg.connect(env.dsn, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await populate(env, idle=args.runs, with_jobs=args.with_jobs)
        print(f"{args.runs + args.with_jobs} active runs, {args.with_jobs} of them get a Job")
        results: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        results["this code"] += run_child(
            env, label="this code", python_path=REPO_OPERATOR, passes=args.passes
        )
        if not args.no_baseline:
            with baseline_checkout(args.baseline) as baseline:
                results[args.baseline] += run_child(
                    env, label=args.baseline, python_path=baseline, passes=min(args.passes, 2)
                )
            results["this code"] += run_child(
                env, label="this code", python_path=REPO_OPERATOR, passes=args.passes
            )
        print("steady passes (after each process's warm-up), median:")
        for label, figures in results.items():
            steady = sorted(
                [f for f in figures if f["pass"] > 0] or figures, key=lambda f: f["seconds"]
            )
            middle = steady[len(steady) // 2]
            print(
                f"  {label:>9}: {middle['seconds']:.2f} s "
                f"per pass ({middle['with_status_writes']:.2f} s with status writes), "
                f"{middle['queries']} SQL statements, {sum(middle['api'].values())} API calls "
                f"(target: under 10 s for {args.runs + args.with_jobs} active runs)"
            )
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(asyncio.run(main()))
