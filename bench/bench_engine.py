"""Run-engine benchmark on the local control plane (kwok) and a local PostgreSQL.

Prints, in one run on the same cluster:
1. the ceiling: the rate at which a plain client creates Jobs that kwok completes;
2. completed single-task runs per minute through the operator, and its share of the ceiling;
3. hand-off latency with 50 concurrent chain runs (t0 -> t1 -> ... -> t4, four hand-offs
   each, 200 in all): from the moment a watcher sees a task's Job complete to the moment the
   same watcher sees its dependent's Job created (so watch lag cancels out), p50 / p99 / max.

Targets (issue 5/8): operator overhead p99 < 250 ms; single-task throughput >= 80% of the
ceiling. Usage:

    .venv/bin/python bench/bench_engine.py [--cluster-dir DIR] [--jobs 200] [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from kubernetes import client as k8s

from flowforge.domain.api import GROUP, RUN_PLURAL, VERSION
from flowforge.domain.validation import parse_definition
from flowforge.store.definitions import publish_definition
from flowforge.store.pool import open_pool
from harness import (
    BenchEnvironment,
    bench_environment,
    create_run_object,
    exit_on_sigterm,
    start_operator,
    stop_operator,
)

STEP = {"image": "busybox:1.36"}
METRICS_PORT = 19464


def operator_handoff() -> str:
    """The operator's own view: event received -> dependent Job created (histogram)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics").read().decode()
    buckets = [
        line
        for line in text.splitlines()
        if line.startswith("flowforge_handoff_latency_seconds_bucket")
    ]
    counts = [
        (line.split('le="')[1].split('"')[0], float(line.rsplit(" ", 1)[1])) for line in buckets
    ]
    total = counts[-1][1] if counts else 0
    shares = ", ".join(
        f"<= {le}s: {count / total:.0%}"
        for le, count in counts
        if total and le in ("0.05", "0.1", "0.25", "0.5", "1.0")
    )
    return f"operator-internal hand-off ({total:.0f} hand-offs): {shares}"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


class JobWatcher:
    """Times when each Job was first seen created and first seen complete.

    Reads the watch stream as raw JSON lines (no model classes): the instrument must not
    compete for the CPU it measures.
    """

    def __init__(self, batch: k8s.BatchV1Api, namespace: str) -> None:
        self.created: dict[str, float] = {}
        self.completed: dict[str, float] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self._batch = batch
        self._namespace = namespace
        self._stop = threading.Event()
        listing = json.loads(batch.list_namespaced_job(namespace, _preload_content=False).data)
        self._version = listing["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            response = self._batch.list_namespaced_job(
                self._namespace,
                watch=True,
                resource_version=self._version,
                timeout_seconds=5,
                allow_watch_bookmarks=True,
                _preload_content=False,
            )
            for line in response:
                now = time.monotonic()
                event = json.loads(line)
                job = event["object"]
                self._version = job["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                name = job["metadata"]["name"]
                self.created.setdefault(name, now)
                self.labels[name] = job["metadata"].get("labels") or {}
                conditions = (job.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Complete" and c["status"] == "True" for c in conditions):
                    self.completed.setdefault(name, now)
            response.release_conn()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def raw_ceiling(batch: k8s.BatchV1Api, namespace: str, count: int) -> float:
    """Jobs per minute a plain client gets created and completed by kwok."""
    watcher = JobWatcher(batch, namespace)
    prefix = f"raw-{uuid.uuid4().hex[:5]}"
    started = time.monotonic()

    def create(index: int) -> None:
        batch.create_namespaced_job(
            namespace,
            {
                "metadata": {"name": f"{prefix}-{index}", "labels": {"bench": prefix}},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "task", "image": "busybox:1.36"}],
                        }
                    },
                },
            },
        )

    threads = [threading.Thread(target=lambda i=i: create(i)) for i in range(count)]
    for index in range(0, count, 16):
        group = threads[index : index + 16]
        for thread in group:
            thread.start()
        for thread in group:
            thread.join()
    while sum(1 for name in watcher.completed if name.startswith(prefix)) < count:
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    watcher.close()
    return count / elapsed * 60


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster-dir", type=Path, help="reuse a running local cluster")
    parser.add_argument("--jobs", type=int, default=200, help="Jobs for the raw ceiling")
    parser.add_argument("--runs", type=int, default=200, help="single-task runs")
    parser.add_argument("--chains", type=int, default=50, help="concurrent chain runs")
    parser.add_argument("--chain-length", type=int, default=5, help="tasks per chain run")
    parser.add_argument(
        "--controller-manager-qps",
        type=int,
        help="lift kube-controller-manager's client limit (default 20/s, which "
        "caps the cluster near 200 Jobs/min) on the bench's own cluster",
    )
    args = parser.parse_args()

    operators: list[subprocess.Popen[bytes]] = []
    async with bench_environment(
        cluster_dir=args.cluster_dir, controller_manager_qps=args.controller_manager_qps
    ) as env:
        try:
            return await measure(env, args, started=operators.append)
        finally:
            for started_operator in operators:
                stop_operator(started_operator)


async def measure(
    env: BenchEnvironment,
    args: argparse.Namespace,
    *,
    started: Callable[[subprocess.Popen[bytes]], None],
) -> int:
    api, namespace = env.api, env.namespace
    batch, custom = k8s.BatchV1Api(api), k8s.CustomObjectsApi(api)
    ceiling = raw_ceiling(batch, namespace, args.jobs)
    print(
        f"raw ceiling: {ceiling:.0f} Jobs/min created and completed "
        f"({args.jobs} Jobs, plain client, 16 concurrent creations)"
    )

    pool = await open_pool(env.dsn, min_size=1, max_size=2)
    for spec in (
        {
            "workflow": "single",
            "version": 1,
            "taskTypes": {"step": STEP},
            "tasks": [{"key": "only", "type": "step"}],
        },
        {
            "workflow": "chain",
            "version": 1,
            "taskTypes": {"step": STEP},
            "tasks": [{"key": "t0", "type": "step"}]
            + [
                {"key": f"t{n}", "type": "step", "dependsOn": [f"t{n - 1}"]}
                for n in range(1, args.chain_length)
            ],
        },
    ):
        await publish_definition(pool, namespace=namespace, definition=parse_definition(spec))
    await pool.close()

    started(
        start_operator(
            env,
            identity="bench",
            metrics_port=METRICS_PORT,
            extra_args=("--job-ttl", "-1"),
            extra_env={"FLOWFORGE_JOB_CREATION_QPS": "200"},
        )
    )
    time.sleep(8)

    def create_runs(prefix: str, workflow: str, count: int) -> list[str]:
        names = [f"{prefix}-{i:03d}" for i in range(count)]

        def create(name: str) -> None:
            create_run_object(custom, namespace, name, workflow=workflow)

        threads = [threading.Thread(target=create, args=(name,)) for name in names]
        for index in range(0, len(threads), 16):
            for thread in threads[index : index + 16]:
                thread.start()
            for thread in threads[index : index + 16]:
                thread.join()
        return names

    def wait_finished(names: list[str], timeout: float, *, poll: float = 0.25) -> dict[str, str]:
        """Poll the runs' phases (a LIST of every run is heavy for the apiserver: the
        interval bounds the throughput figure's error, 0.25 s in 60 s)."""
        deadline = time.monotonic() + timeout
        wanted = set(names)
        phases: dict[str, str] = {}
        while time.monotonic() < deadline:
            runs = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, RUN_PLURAL)
            items = runs["items"]
            phases = {
                item["metadata"]["name"]: (item.get("status") or {}).get("phase", "")
                for item in items
                if item["metadata"]["name"] in wanted
            }
            if len(phases) == len(wanted) and all(
                p in ("Succeeded", "Failed", "Cancelled") for p in phases.values()
            ):
                return phases
            time.sleep(poll)
        raise SystemExit(f"runs not finished in {timeout} s: {phases}")

    # warm-up: one run through every path
    wait_finished(create_runs("warm", "chain", 1), 120)

    started = time.monotonic()
    names = create_runs("single", "single", args.runs)
    phases = wait_finished(names, 600)
    elapsed = time.monotonic() - started
    throughput = len(names) / elapsed * 60
    assert set(phases.values()) == {"Succeeded"}, phases
    print(
        f"single-task runs: {throughput:.0f} runs/min completed ({len(names)} runs in "
        f"{elapsed:.1f} s) = {throughput / ceiling:.0%} of the raw ceiling (target >= 80%)"
    )

    watcher = JobWatcher(batch, namespace)
    names = create_runs("chain", "chain", args.chains)
    wait_finished(names, 600, poll=2)
    time.sleep(1)
    watcher.close()
    by_run: dict[str, dict[str, str]] = {}
    for job, labels in watcher.labels.items():
        by_run.setdefault(labels.get("flowforge.io/run", ""), {})[
            labels.get("flowforge.io/task", "")
        ] = job
    handoffs: list[tuple[float, str]] = []
    for name in names:
        jobs = by_run.get(name, {})
        for n in range(1, args.chain_length):
            upstream, dependent = jobs.get(f"t{n - 1}"), jobs.get(f"t{n}")
            if upstream in watcher.completed and dependent in watcher.created:
                handoffs.append(
                    (
                        watcher.created[dependent] - watcher.completed[upstream],
                        f"{name} t{n - 1}->t{n}",
                    )
                )
    latencies = [latency for latency, _ in handoffs]
    expected = args.chains * (args.chain_length - 1)
    print(
        f"hand-off latency, {len(latencies)} of {expected} hand-offs in "
        f"{args.chains} concurrent runs: "
        f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms, "
        f"mean {statistics.fmean(latencies) * 1000:.0f} ms (target p99 < 250 ms)"
    )
    print(operator_handoff())
    print(
        "slowest: "
        + ", ".join(f"{where} {latency * 1000:.0f} ms" for latency, where in sorted(handoffs)[-3:])
    )
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(asyncio.run(main()))
