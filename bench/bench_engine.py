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
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flowforge.localdev import postgres as localdev_postgres
from flowforge.localdev.controlplane import stop_cluster
from harness import (
    STEP,
    job_watcher,
    percentile,
    publish,
    raw_ceiling,
    start_bench,
    start_operator,
    stop_process,
    wait_finished,
)
from harness import create_runs as _create_runs

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

    work = Path(tempfile.mkdtemp(prefix="flowforge-bench-"))
    work.chmod(0o755)  # the PostgreSQL server account must reach work/pg
    cluster_dir = args.cluster_dir or work / "cluster"
    operator: subprocess.Popen[bytes] | None = None
    try:
        bench = start_bench(
            work, cluster_dir=cluster_dir, controller_manager_qps=args.controller_manager_qps
        )
        batch, custom = bench.batch, bench.custom
        namespace = bench.new_namespace()

        ceiling = raw_ceiling(batch, namespace, args.jobs)
        print(
            f"raw ceiling: {ceiling:.0f} Jobs/min created and completed "
            f"({args.jobs} Jobs, plain client, 16 concurrent creations)"
        )

        await publish(
            bench.dsn,
            namespace,
            (
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
            ),
        )
        operator = start_operator(
            bench, namespace, log=work / "operator.log", metrics_port=METRICS_PORT
        )

        def create_runs(prefix: str, workflow: str, count: int) -> list[str]:
            return _create_runs(custom, namespace, prefix, workflow, count)

        # warm-up: one run through every path
        wait_finished(custom, namespace, create_runs("warm", "chain", 1), 120)

        started = time.monotonic()
        names = create_runs("single", "single", args.runs)
        phases = wait_finished(custom, namespace, names, 600)
        elapsed = time.monotonic() - started
        throughput = len(names) / elapsed * 60
        assert set(phases.values()) == {"Succeeded"}, phases
        print(
            f"single-task runs: {throughput:.0f} runs/min completed ({len(names)} runs in "
            f"{elapsed:.1f} s) = {throughput / ceiling:.0%} of the raw ceiling (target >= 80%)"
        )

        watcher = job_watcher(batch, namespace)
        names = create_runs("chain", "chain", args.chains)
        wait_finished(custom, namespace, names, 600, poll=2)
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
            + ", ".join(
                f"{where} {latency * 1000:.0f} ms" for latency, where in sorted(handoffs)[-3:]
            )
        )
        return 0
    finally:
        stop_process(operator)
        localdev_postgres.stop(work / "pg")
        if args.cluster_dir is None:
            stop_cluster(cluster_dir)
        if os.environ.get("FLOWFORGE_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # run the finally blocks: stop the cluster and servers


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(asyncio.run(main()))
