"""Queue hand-off benchmark on the local control plane (kwok) and a local PostgreSQL.

A workflow with ``spec.concurrency.maxRuns: 1``: a first run holds the slot for ``--hold``
seconds while ``--queued`` single-task runs are created behind it and wait in the queue.
Each time the running run's Job completes, the transaction that records it finishes the run
and starts the next queued one, whose Job the same decision creates. The hand-off is
measured as ``bench_engine`` measures the in-run one: the moment a watcher sees the running
run's Pod finished (the operator reads the task's success from its Pod) -> the moment a
watcher sees the next run's Job created.

Baseline, interleaved round by round on the same cluster and operator: the same number of
hand-offs inside one chain run (t0 -> t1 -> ...), which no limit holds. Target (issue 16):
queue hand-off p99 < 250 ms. Usage:

    .venv/bin/python bench/bench_queue.py [--cluster-dir DIR] [--queued 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path

from bench_engine import chain_handoffs
from harness.cluster import bench_environment, exit_on_sigterm
from harness.runs import STEP, chain_definition
from harness.watch import Watcher, figures, job_watcher, percentile, pod_watcher


def queue_handoffs(jobs: Watcher, pods: Watcher, names: list[str]) -> list[float]:
    """The runs ran one at a time: each run's Pod finished -> the next run's Job created (the
    runs in the order of their Jobs' creation)."""
    wanted = set(names)
    order = sorted(
        (created, job)
        for job, created in jobs.created.items()
        if jobs.labels.get(job, {}).get("flowforge.io/run") in wanted
    )
    assert len(order) == len(names), f"{len(order)} Jobs for {len(names)} runs"
    pod_of = {run: pod for (run, _), pod in pods.by_task().items()}
    handoffs = []
    for (_, previous), (created, _) in itertools.pairwise(order):
        finished = pods.completed[pod_of[jobs.labels[previous]["flowforge.io/run"]]]
        assert finished <= created, "two runs of a maxRuns: 1 workflow ran at once"
        handoffs.append(created - finished)
    return handoffs


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster-dir", type=Path, help="reuse a running local cluster")
    parser.add_argument("--queued", type=int, default=50, help="runs waiting in the queue")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, queue and baseline")
    parser.add_argument("--hold", type=int, default=20, help="seconds the first run holds the slot")
    args = parser.parse_args()
    async with bench_environment(cluster_dir=args.cluster_dir) as env:
        queued = {
            "workflow": "queued",
            "version": 1,
            "concurrency": {"maxRuns": 1, "policy": "Queue"},
            "taskTypes": {"step": STEP},
            "tasks": [{"key": "only", "type": "step"}],
        }
        # version 2: the same workflow (so the same limit), its one task takes a while
        slow = {**STEP, "annotations": {"flowforge.io/simulate-duration": f"{args.hold}s"}}
        holder = {**queued, "version": 2, "taskTypes": {"step": slow}}
        await env.publish(queued, holder, chain_definition(args.queued + 1))
        env.start_operator(metrics_port=19465)
        env.wait_finished(env.create_runs("warm", "queued", 2), 120)  # every path once

        queue: list[float] = []
        baseline: list[float] = []
        for round_number in range(args.rounds):
            # the holder takes the slot; the runs queue behind it while it runs, so every
            # hand-off happens with the queue already there (not during its creation)
            jobs = job_watcher(env.bench.batch, env.namespace)
            pods = pod_watcher(env.bench.core, env.namespace)
            names = env.create_runs(f"h{round_number}", "queued", 1, version=2)
            time.sleep(2)
            names += env.create_runs(f"q{round_number}", "queued", args.queued)
            started = time.monotonic()
            env.wait_finished(names, 600, poll=1)
            elapsed = time.monotonic() - started
            time.sleep(1)
            jobs.close()
            pods.close()
            queue += queue_handoffs(jobs, pods, names)
            print(
                f"round {round_number + 1}: {args.queued} queued runs behind a "
                f"{args.hold} s holder in {elapsed:.1f} s"
            )

            chain = chain_handoffs(env, f"c{round_number}", chains=1, length=args.queued + 1)
            baseline += [latency for latency, _ in chain["flowforge"]]

        print(
            f"queue hand-off (a run's Pod finished -> the next queued run's Job created), "
            f"{len(queue)} hand-offs from a queue of {args.queued}: {figures(queue)} "
            "(target p99 < 250 ms)"
        )
        print(f"baseline in-run hand-off, {len(baseline)} hand-offs: {figures(baseline)}")
        ratio_50 = percentile(queue, 0.5) / max(percentile(baseline, 0.5), 1e-6)
        ratio_99 = percentile(queue, 0.99) / max(percentile(baseline, 0.99), 1e-6)
        print(f"queue / baseline: p50 x{ratio_50:.2f}, p99 x{ratio_99:.2f}")
        return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(asyncio.run(main()))
