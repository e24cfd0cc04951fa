"""Where a FlowForge hand-off's time goes: the Job controller's share beside FlowForge's own.

Starts a local control plane (kube-controller-manager's client limit lifted by default, which
also gives its Job controller 50 workers), a PostgreSQL server and the operator, submits
``--chains`` concurrent 5-task chains and watches the namespace's Jobs and Pods (raw watch
streams, one watcher each). For every step of every chain it splits the hand-off (``t(n-1)``'s
Pod finished -> ``t(n)``'s Pod created, what ``bench_peer.py`` reports) into:

1. Pod finished -> the next step's Job created: FlowForge (the Pod watch's event, the store,
   the Job's creation; the Job watch's when the Pod's did not decide);
2. the next Job created -> its Pod created: the Job controller;

and beside them, what FlowForge no longer waits for: Pod finished -> its Job has
``SuccessCriteriaMet`` (the Job controller syncs a Job at most once a second after a Pod
changes, ``SyncJobBatchPeriod``, and queues it behind others), then ``Complete`` (the Job
controller removes the Pod's finalizer).

Prints p50 / p90 / p99 / max of each, and the Job controller's workqueue figures (syncs, mean
wait in the queue, mean sync) from its own metrics. No target is asserted.

    .venv/bin/python bench/bench_handoff.py [--chains 50] [--controller-manager-qps 200|default]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

from bench_peer import CHAIN_LENGTH, QUICK, FlowForge
from flowforge.localdev import postgres as localdev_postgres
from flowforge.localdev.controlplane import stop_cluster
from harness.cluster import remove_work, start_bench, work_directory
from harness.runs import wait_phases
from harness.watch import Watcher, condition, pod_finished, run_watcher

STAGES = (
    "Pod finished -> next Job created",
    "next Job created -> its Pod created",
    "Pod finished -> Job SuccessCriteriaMet",
    "SuccessCriteriaMet -> Job Complete",
    "hand-off (Pod finished -> next Pod)",
)


def job_queue_figures(cluster_dir: Path) -> str:
    """The Job controller's workqueue, from kube-controller-manager's /metrics."""
    processes = subprocess.run(
        ["ps", "-eo", "args"], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    line = next(
        p
        for p in processes.splitlines()
        if "kube-controller-manager" in p and str(cluster_dir) in p
    )
    port = line.split("--secure-port=")[1].split()[0]
    metrics = subprocess.run(
        ["curl", "-sk", f"https://127.0.0.1:{port}/metrics"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    values: dict[str, float] = {}
    for row in metrics.splitlines():
        for name in ("queue_duration_seconds", "work_duration_seconds"):
            for suffix in ("_sum", "_count"):
                if row.startswith(f'workqueue_{name}{suffix}{{name="job"}}'):
                    values[name + suffix] = float(row.rsplit(" ", 1)[1])
    syncs = values.get("work_duration_seconds_count", 0.0) or 1.0
    return (
        f"Job controller: {syncs:.0f} syncs, mean wait in its queue "
        f"{values.get('queue_duration_seconds_sum', 0.0) / syncs * 1000:.0f} ms, mean sync "
        f"{values.get('work_duration_seconds_sum', 0.0) / syncs * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=50)
    parser.add_argument("--controller-manager-qps", default="200")
    args = parser.parse_args()
    qps = None if args.controller_manager_qps == "default" else int(args.controller_manager_qps)

    work = work_directory("flowforge-handoff-")
    cluster_dir = work / "cluster"
    bench = start_bench(work, cluster_dir=cluster_dir, controller_manager_qps=qps)
    engine = FlowForge()
    try:
        namespace = bench.new_namespace("handoff")
        engine.start(bench, namespace, work, QUICK)
        complete = Watcher(
            bench.batch.list_namespaced_job, namespace, finished=condition("Complete")
        )
        criteria = Watcher(
            bench.batch.list_namespaced_job, namespace, finished=condition("SuccessCriteriaMet")
        )
        pods = Watcher(bench.core.list_namespaced_pod, namespace, finished=pod_finished)
        runs = run_watcher(bench.custom, namespace, engine.resource, final=engine.final)
        names = engine.submit("chains", "chain", args.chains)
        wait_phases(lambda: dict(runs.phases), names, 1200, poll=0.05, final=engine.final)
        time.sleep(1)
        jobs_of, pods_of = complete.by_task(), pods.by_task()
        stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
        for run in names:
            for n in range(1, CHAIN_LENGTH):
                upstream, dependent = (run, f"t{n - 1}"), (run, f"t{n}")
                pod_done = pods.completed[pods_of[upstream]]
                met = criteria.completed[jobs_of[upstream]]
                done = complete.completed[jobs_of[upstream]]
                next_job = complete.created[jobs_of[dependent]]
                next_pod = pods.created[pods_of[dependent]]
                for stage, seconds in zip(
                    STAGES,
                    (next_job - pod_done, next_pod - next_job, met - pod_done, done - met),
                    strict=False,
                ):
                    stages[stage].append(seconds)
                stages[STAGES[-1]].append(next_pod - pod_done)
        print(
            f"{args.chains} concurrent {CHAIN_LENGTH}-task chains, controller manager QPS "
            f"{args.controller_manager_qps} (ms, {len(stages[STAGES[-1]])} hand-offs)"
        )
        for stage, values in stages.items():
            ordered = sorted(values)
            print(
                f"  {stage:<40} p50 {statistics.median(ordered) * 1000:6.0f}  "
                f"p90 {ordered[int(len(ordered) * 0.9)] * 1000:6.0f}  "
                f"p99 {ordered[int(len(ordered) * 0.99)] * 1000:6.0f}  "
                f"max {ordered[-1] * 1000:6.0f}"
            )
        print(f"  {job_queue_figures(cluster_dir)}")
        for watcher in (complete, criteria, pods, runs):
            watcher.close()
    finally:
        engine.stop()
        localdev_postgres.stop(work / "pg")
        stop_cluster(cluster_dir)
        remove_work(work)


if __name__ == "__main__":
    main()
