"""Queue hand-off benchmark on the local control plane (kwok) and a local PostgreSQL.

A workflow with ``spec.concurrency.maxRuns: 1``: a first run holds the slot for ``--hold``
seconds while ``--queued`` single-task runs are created behind it and wait in the queue.
Each time the running run's Job completes, the transaction that records it finishes the run
and starts the next queued one, whose Job the same decision creates. The hand-off is
measured as ``bench_engine`` measures the in-run one, by one watcher: the moment it sees the
running run's Job complete -> the moment it sees the next run's Job created (so watch lag
cancels out).

Baseline, interleaved round by round on the same cluster and operator: the same number of
hand-offs inside one chain run (t0 -> t1 -> ...), which no limit holds. Target (issue 16):
queue hand-off p99 < 250 ms. Usage:

    .venv/bin/python bench/bench_queue.py [--cluster-dir DIR] [--queued 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
import time
from pathlib import Path

from bench_engine import (
    STEP,
    JobWatcher,
    _exit_on_sigterm,
    bench_environment,
    chain_definition,
    chain_handoffs,
    figures,
    percentile,
)


def queue_handoffs(watcher: JobWatcher, names: list[str]) -> list[float]:
    """The runs ran one at a time: each Job (in creation order) completed -> the next created."""
    wanted = set(names)
    jobs = sorted(
        (created, job)
        for job, created in watcher.created.items()
        if watcher.labels.get(job, {}).get("flowforge.io/run") in wanted
    )
    assert len(jobs) == len(names), f"{len(jobs)} Jobs for {len(names)} runs"
    handoffs = []
    for (_, previous), (created, _) in itertools.pairwise(jobs):
        completed = watcher.completed[previous]
        assert completed <= created, "two runs of a maxRuns: 1 workflow ran at once"
        handoffs.append(created - completed)
    return handoffs


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster-dir", type=Path, help="reuse a running local cluster")
    parser.add_argument("--queued", type=int, default=50, help="runs waiting in the queue")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, queue and baseline")
    parser.add_argument("--hold", type=int, default=20, help="seconds the first run holds the slot")
    args = parser.parse_args()
    async with bench_environment(cluster_dir=args.cluster_dir) as bench:
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
        await bench.publish(queued, holder, chain_definition(args.queued + 1))
        bench.start_operator()
        bench.wait_finished(bench.create_runs("warm", "queued", 2), 120)  # every path once

        queue: list[float] = []
        baseline: list[float] = []
        for round_number in range(args.rounds):
            # the holder takes the slot; the runs queue behind it while it runs, so every
            # hand-off happens with the queue already there (not during its creation)
            watcher = JobWatcher(bench.batch, bench.namespace)
            names = bench.create_runs(f"h{round_number}", "queued", 1, version=2)
            time.sleep(2)
            names += bench.create_runs(f"q{round_number}", "queued", args.queued)
            started = time.monotonic()
            bench.wait_finished(names, 600, poll=1)
            elapsed = time.monotonic() - started
            time.sleep(1)
            watcher.close()
            queue += queue_handoffs(watcher, names)
            print(
                f"round {round_number + 1}: {args.queued} queued runs behind a "
                f"{args.hold} s holder in {elapsed:.1f} s"
            )

            watcher = JobWatcher(bench.batch, bench.namespace)
            chain = bench.create_runs(f"c{round_number}", "chain", 1)
            bench.wait_finished(chain, 600, poll=1)
            time.sleep(1)
            watcher.close()
            baseline += [
                latency for latency, _ in chain_handoffs(watcher, chain, length=args.queued + 1)
            ]

        print(
            f"queue hand-off (a slot frees -> the next queued run's first Job created), "
            f"{len(queue)} hand-offs from a queue of {args.queued}: {figures(queue)} "
            "(target p99 < 250 ms)"
        )
        print(f"baseline in-run hand-off, {len(baseline)} hand-offs: {figures(baseline)}")
        ratio_50 = percentile(queue, 0.5) / max(percentile(baseline, 0.5), 1e-6)
        ratio_99 = percentile(queue, 0.99) / max(percentile(baseline, 0.99), 1e-6)
        print(f"queue / baseline: p50 x{ratio_50:.2f}, p99 x{ratio_99:.2f}")
        return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(asyncio.run(main()))
