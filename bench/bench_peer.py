"""FlowForge beside Argo Workflows on one local control plane (kwok), in one run.

Each engine runs alone on the cluster in turn (its own namespace, its controller started for
its turn and stopped after it), round after round (A B C, then C B A), on a cluster with
kube-controller-manager's default client limit and on one with it lifted. Every task's Pod
runs ``--step-seconds`` (2 s by default) for both engines: kwok holds it running for the
``flowforge.io/simulate-duration`` annotation, set on FlowForge's task types and on Argo's
templates alike. FlowForge runs as the benches run it (``harness.processes``): Jobs kept (no
TTL deletions), no admission webhooks (runs created straight, definitions published into
the store). The same workloads for every engine:

1. ``single``: N single-task runs submitted at once: completed runs per minute;
2. ``chains``: concurrent 5-task chains: hand-off latency, a step's Pod finished -> the next
   step's Pod created, both seen by one Pod watcher (so watch lag cancels out);
3. ``dag``: one random DAG (fan-in <= 4, fixed seed): makespan, submission -> run final;
4. ``failing``: a 3-task run whose last task fails: submission -> run final (Argo: Failed;
   FlowForge: Failed after the compensators of the two succeeded tasks ran; not like for like);

and, over an engine's turn, the apiserver's own ``apiserver_request_total`` writes (POST, PUT,
PATCH, DELETE, APPLY; every client of the cluster, the Job controller, scheduler and kwok
included; Lease renewals, the control plane's heartbeats, left out) per completed task Pod,
and the controller process's CPU seconds per task Pod (FlowForge's: the operator and its
PostgreSQL server).
The raw ceilings: a plain client creating Jobs / Pods that kwok completes.

Argo's controller (bench/peer/build_argo.sh builds it from the Go module proxy into the
cache) runs out of cluster with --namespaced, leader election off, metrics off and its health
server on loopback. No Argo executor runs under kwok: bench/peer/argo-stages.yaml completes
an Argo Pod's containers, wait container included, so no WorkflowTaskResult exists and the
controller takes each node's result from the Pod; the executor's own writes (creating and
patching a WorkflowTaskResult per Pod) are therefore not in Argo's figures.

    .venv/bin/python bench/bench_peer.py [--quick] [--rounds 2] [--workloads single,chains]
        [--engines flowforge,argo,argo-tuned] [--controller-manager-qps default,200]
        [--runs 200] [--chains 50] [--dag-tasks 1000] [--raw 200]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowforge.domain.api import GROUP, RUN_PLURAL, VERSION
from flowforge.localdev import postgres as localdev_postgres
from flowforge.localdev.controlplane import stop_cluster
from harness.cluster import Bench, remove_work, start_bench, work_directory
from harness.processes import (
    PROFILE_DIR,
    Profiler,
    cpu_seconds,
    postgres_pid,
    start_operator,
    stop_process,
)
from harness.runs import STEP, create_runs, publish, wait_phases
from harness.watch import (
    Watcher,
    in_groups,
    percentile,
    pod_watcher,
    raw_ceiling,
    raw_pod_ceiling,
    run_watcher,
)

HERE = Path(__file__).resolve().parent
PEER = HERE / "peer"
ARGO_GROUP, ARGO_VERSION, ARGO_PLURAL = "argoproj.io", "v1alpha1", "workflows"
ARGO_FINAL = ("Succeeded", "Failed", "Error")
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
# FlowForge's own writes besides its Events: a run's status and finalizers, its Jobs (created;
# deleted after their TTL), its ConfigMaps; the bench creates the runs (POST workflowruns)
FLOWFORGE_WRITES = frozenset(
    {
        ("PATCH", "workflowruns"),
        ("PATCH", "workflowruns/status"),
        ("POST", "jobs"),
        ("DELETE", "jobs"),
        ("POST", "configmaps"),
    }
)
FLOWFORGE_COMPONENT = "flowforge-operator"
FAIL_ANNOTATIONS = {"flowforge.io/simulate-exit-code": "1"}
WORKLOADS = ("single", "chains", "dag", "failing")
ENGINES = ("flowforge", "argo", "argo-tuned")
CHAIN_LENGTH = 5
DAG_SEED = 18


@dataclass(frozen=True)
class Sizes:
    runs: int
    chains: int
    dag_tasks: int
    raw: int
    step_seconds: float = 2.0

    def step_annotations(self) -> dict[str, str]:
        """What makes kwok hold a task's Pod running for ``step_seconds`` (deploy/local/
        kwok-stages.yaml for FlowForge's Pods, peer/argo-stages.yaml for Argo's)."""
        if not self.step_seconds:
            return {}
        return {"flowforge.io/simulate-duration": f"{self.step_seconds:g}s"}


FULL = Sizes(runs=200, chains=50, dag_tasks=1000, raw=200)
QUICK = Sizes(runs=20, chains=5, dag_tasks=60, raw=30)


def random_dag(tasks: int) -> list[tuple[str, list[str]]]:
    """Keys and dependencies: each task depends on 1-4 of the 40 tasks before it (a few roots
    among them), drawn with a fixed seed so both engines run the same graph."""
    rng = random.Random(DAG_SEED)
    graph: list[tuple[str, list[str]]] = []
    for index in range(tasks):
        window = list(range(max(0, index - 40), index))
        if index < 4 or rng.random() < 0.02:
            graph.append((f"t{index}", []))
            continue
        picks = rng.sample(window, min(len(window), rng.randint(1, 4)))
        graph.append((f"t{index}", [f"t{pick}" for pick in sorted(picks)]))
    return graph


def chain(length: int) -> list[tuple[str, list[str]]]:
    return [(f"t{n}", [f"t{n - 1}"] if n else []) for n in range(length)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Engine:
    """One engine's turn on the cluster: start, submit the workloads, read phases, stop."""

    name: str
    final: tuple[str, ...]
    resource: tuple[str, str, str]  # group, version, plural of a run
    custom: Any
    namespace: str
    process: subprocess.Popen[bytes] | None = None

    def start(self, bench: Bench, namespace: str, work: Path, sizes: Sizes) -> None:
        raise NotImplementedError

    def submit(self, workload: str, prefix: str, count: int) -> list[str]:
        raise NotImplementedError

    def pod_task(self, labels: dict[str, str], annotations: dict[str, str]) -> tuple[str, str]:
        """(run, task) of one of the engine's Pods."""
        raise NotImplementedError

    def cpu(self) -> float:
        """CPU seconds so far of what the engine runs on: its controller (FlowForge: and
        PostgreSQL)."""
        assert self.process is not None
        return cpu_seconds(self.process.pid)

    def run_object_bytes(self, name: str) -> int:
        """The size of one run's object as the apiserver serves it (JSON): what etcd holds
        and every watcher of the resource receives on each change."""
        group, version, plural = self.resource
        body = self.custom.get_namespaced_custom_object(
            group, version, self.namespace, plural, name
        )
        return len(json.dumps(body, separators=(",", ":")))

    def peak_rss_mib(self) -> float:
        """The controller process's resident-set high-water mark (``VmHWM``)."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None


class FlowForge(Engine):
    name = "flowforge"
    final = ("Succeeded", "Failed", "Cancelled")
    resource = (GROUP, VERSION, RUN_PLURAL)

    def start(self, bench: Bench, namespace: str, work: Path, sizes: Sizes) -> None:
        self.custom, self.namespace, self.postgres_dir = bench.custom, namespace, bench.postgres_dir

        def spec(workflow: str, graph: list[tuple[str, list[str]]]) -> dict[str, Any]:
            return {
                "workflow": workflow,
                "version": 1,
                "taskTypes": {
                    "step": {**STEP, "annotations": sizes.step_annotations()},
                    "fail": {
                        **STEP,
                        "annotations": {**sizes.step_annotations(), **FAIL_ANNOTATIONS},
                    },
                },
                "tasks": [
                    {"key": key, "type": "step", **({"dependsOn": deps} if deps else {})}
                    for key, deps in graph
                ],
            }

        failing = spec("failing", chain(3))
        failing["tasks"][2]["type"] = "fail"
        failing["tasks"] += [
            {"key": f"undo-t{n}", "type": "step", "compensateFor": f"t{n}"} for n in (0, 1)
        ]
        asyncio.run(
            publish(
                bench.dsn,
                namespace,
                (
                    spec("single", [("only", [])]),
                    spec("chains", chain(CHAIN_LENGTH)),
                    spec("dag", random_dag(sizes.dag_tasks)),
                    failing,
                ),
            )
        )
        self.process = start_operator(
            dsn=bench.dsn,
            kubeconfig=bench.kubeconfig,
            namespace=namespace,
            log=work / f"operator-{namespace}.log",
            metrics_port=free_port(),
        )

    def cpu(self) -> float:
        return super().cpu() + cpu_seconds(postgres_pid(self.postgres_dir))

    def submit(self, workload: str, prefix: str, count: int) -> list[str]:
        return create_runs(self.custom, self.namespace, prefix, workload, count)

    def pod_task(self, labels: dict[str, str], annotations: dict[str, str]) -> tuple[str, str]:
        return labels.get("flowforge.io/run", ""), labels.get("flowforge.io/task", "")


class Argo(Engine):
    final = ARGO_FINAL
    resource = (ARGO_GROUP, ARGO_VERSION, ARGO_PLURAL)

    def __init__(self, *, tuned: bool) -> None:
        self.name = "argo-tuned" if tuned else "argo"
        # docs/scaling.md: --workflow-workers (default 32), --qps / --burst (default 20 / 30);
        # resourceRateLimit (Pod creations) is unlimited by default.
        self.flags = ["--workflow-workers", "64", "--qps", "200", "--burst", "400"] if tuned else []
        # docs/environment-variables.md: the workflow queue's re-queue time, 10 s by default
        # (a DAG's next step waits for it)
        self.env = {"DEFAULT_REQUEUE_TIME": "1s"} if tuned else {}

    def start(self, bench: Bench, namespace: str, work: Path, sizes: Sizes) -> None:
        self.custom, self.namespace, self.dag = bench.custom, namespace, random_dag(sizes.dag_tasks)
        self.step_annotations = sizes.step_annotations()
        bench.core.create_namespaced_config_map(
            namespace,
            {
                "metadata": {"name": "workflow-controller-configmap"},
                # its metrics server would listen on every interface: off
                "data": {
                    "config": "metricsConfig:\n  enabled: false\n"
                    "telemetryConfig:\n  enabled: false\n"
                },
            },
        )
        self.process = subprocess.Popen(
            [
                str(argo_controller()),
                "--kubeconfig",
                str(bench.cluster.kubeconfig),
                "--namespace",
                namespace,
                "--namespaced",
                "--loglevel",
                "warn",
                *self.flags,
            ],
            env={**os.environ, "LEADER_ELECTION_DISABLE": "true", **self.env},
            stdout=(work / f"argo-{namespace}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        time.sleep(5)

    def workflow(self, name: str, workload: str) -> dict[str, Any]:
        # a command: Argo's emissary executor would otherwise look the image's up in a registry
        step = {
            "name": "step",
            "container": {"image": "busybox:1.36", "command": ["true"]},
            "metadata": {"annotations": self.step_annotations},
        }
        fail = {
            **step,
            "name": "fail",
            "metadata": {"annotations": {**self.step_annotations, **FAIL_ANNOTATIONS}},
        }
        graph = {"chains": chain(CHAIN_LENGTH), "dag": self.dag, "failing": chain(3)}.get(
            workload, []
        )
        if workload == "single":
            templates = [step]
            entrypoint = "step"
        else:
            tasks = [
                {
                    "name": key,
                    "template": "fail" if workload == "failing" and key == "t2" else "step",
                    **({"dependencies": deps} if deps else {}),
                }
                for key, deps in graph
            ]
            templates = [{"name": "main", "dag": {"tasks": tasks}}, step, fail]
            entrypoint = "main"
        return {
            "apiVersion": f"{ARGO_GROUP}/{ARGO_VERSION}",
            "kind": "Workflow",
            "metadata": {"name": name},
            "spec": {"entrypoint": entrypoint, "templates": templates},
        }

    def submit(self, workload: str, prefix: str, count: int) -> list[str]:
        names = [f"{prefix}-{i:03d}" for i in range(count)]
        in_groups(
            lambda name: self.custom.create_namespaced_custom_object(
                ARGO_GROUP, ARGO_VERSION, self.namespace, ARGO_PLURAL, self.workflow(name, workload)
            ),
            names,
        )
        return names

    def pod_task(self, labels: dict[str, str], annotations: dict[str, str]) -> tuple[str, str]:
        run = labels.get("workflows.argoproj.io/workflow", "")
        node = annotations.get("workflows.argoproj.io/node-name", "")
        return run, node.split(".", 1)[1] if "." in node else ""


def argo_controller() -> Path:
    """The cached controller binary, built first when missing."""
    built = subprocess.run(
        ["bash", str(PEER / "build_argo.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(built.stdout.strip().splitlines()[-1])


@dataclass
class Turn:
    """What one engine's turn measured."""

    engine: str
    round: int
    throughput: float | None = None
    handoffs: list[float] = field(default_factory=list)
    makespan: float | None = None
    failing: float | None = None
    failing_note: str = ""
    tasks: int = 0
    writes: Counter[tuple[str, str]] = field(default_factory=Counter)
    # the Events created in the namespace over the turn, by their source component
    events: Counter[str] = field(default_factory=Counter)
    cpu: float = 0.0
    cluster_cpu: float = 0.0
    # over the single-task runs alone: (controller, cluster) CPU seconds per run
    single_cpu: tuple[float, float] | None = None
    dag_object_kib: float | None = None
    peak_rss_mib: float | None = None


def run_turn(
    engine: Engine,
    *,
    bench: Bench,
    work: Path,
    sizes: Sizes,
    workloads: list[str],
    round_number: int,
) -> Turn:
    namespace = bench.new_namespace(engine.name)
    turn = Turn(engine=engine.name, round=round_number)
    engine.start(bench, namespace, work, sizes)
    assert engine.process is not None
    watcher = pod_watcher(bench.core, namespace)
    runs = run_watcher(bench.custom, namespace, engine.resource, final=engine.final)
    try:

        def finish(names: list[str], timeout: float, poll: float = 0.05) -> dict[str, str]:
            return wait_phases(
                lambda: dict(runs.phases), names, timeout, poll=poll, final=engine.final
            )

        warm = finish(engine.submit("chains", "warm", 1), 300)  # one run through every path
        assert set(warm.values()) == {"Succeeded"}, warm
        warm_pods = set(watcher.completed)
        writes_before, cpu_before = bench.apiserver_requests(), engine.cpu()
        events_before = event_sources(bench, namespace)
        cluster_cpu_before = bench.cluster_cpu()
        if PROFILE_DIR and isinstance(engine, FlowForge):
            Profiler.begin(bench.dsn)

        if "single" in workloads:
            started, controller, cluster = time.monotonic(), engine.cpu(), bench.cluster_cpu()
            phases = finish(engine.submit("single", "single", sizes.runs), 1200)
            turn.throughput = len(phases) / (time.monotonic() - started) * 60
            turn.single_cpu = (
                (engine.cpu() - controller) / sizes.runs,
                (bench.cluster_cpu() - cluster) / sizes.runs,
            )
            assert set(phases.values()) == {"Succeeded"}, phases
        if "chains" in workloads:
            names = engine.submit("chains", "chain", sizes.chains)
            finish(names, 1200)
            time.sleep(1)
            turn.handoffs = handoffs(engine, watcher, names)
        if "dag" in workloads:
            started = time.monotonic()
            names = engine.submit("dag", "dag", 1)
            phases = finish(names, 3600)
            turn.makespan = time.monotonic() - started
            assert set(phases.values()) == {"Succeeded"}, phases
            turn.dag_object_kib = engine.run_object_bytes(names[0]) / 1024
        if "failing" in workloads:
            started = time.monotonic()
            names = engine.submit("failing", "failing", 1)
            phases = finish(names, 600)
            turn.failing = time.monotonic() - started
            time.sleep(1)
            tasks = sorted(
                task
                for pod in watcher.completed
                for run, task in [engine.pod_task(watcher.labels[pod], watcher.annotations[pod])]
                if run == names[0]
            )
            turn.failing_note = f"{phases[names[0]]}: {' '.join(tasks)}"

        turn.cpu = engine.cpu() - cpu_before
        turn.cluster_cpu = bench.cluster_cpu() - cluster_cpu_before
        turn.peak_rss_mib = engine.peak_rss_mib()
        writes_after = bench.apiserver_requests()
        turn.writes = Counter(
            {
                key: writes_after[key] - writes_before.get(key, 0)
                for key in writes_after
                if key[0] in WRITE_VERBS
                and key[1] != "leases"  # the control plane's heartbeats: time, not tasks
                and writes_after[key] > writes_before.get(key, 0)
            }
        )
        events_after = event_sources(bench, namespace)
        turn.events = Counter(
            events_after[uid] for uid in events_after.keys() - events_before.keys()
        )
        turn.tasks = len(set(watcher.completed) - warm_pods)
        if PROFILE_DIR and isinstance(engine, FlowForge):
            output = Path(PROFILE_DIR) / f"statements-{namespace}.txt"
            Profiler.report(bench.dsn, tasks=turn.tasks, output=output)
    finally:
        watcher.close()
        runs.close()
        engine.stop()
    return turn


def event_sources(bench: Bench, namespace: str) -> dict[str, str]:
    """The namespace's Events: uid -> the component that reported it."""
    listing = json.loads(bench.core.list_namespaced_event(namespace, _preload_content=False).data)
    return {
        item["metadata"]["uid"]: item.get("reportingComponent")
        or (item.get("source") or {}).get("component")
        or "?"
        for item in listing["items"]
    }


def handoffs(engine: Engine, watcher: Watcher, names: list[str]) -> list[float]:
    """Per chain run: t(n-1)'s Pod seen finished -> t(n)'s Pod seen created."""
    pods: dict[tuple[str, str], str] = {}
    for pod, labels in watcher.labels.items():
        pods[engine.pod_task(labels, watcher.annotations[pod])] = pod
    latencies = []
    for name in names:
        for n in range(1, CHAIN_LENGTH):
            upstream, dependent = pods.get((name, f"t{n - 1}")), pods.get((name, f"t{n}"))
            if upstream in watcher.completed and dependent in watcher.created:
                latencies.append(watcher.created[dependent] - watcher.completed[upstream])
    return latencies


def raw_owner(bench: Bench, namespace: str) -> dict[str, Any]:
    """An Argo Workflow no controller runs (none watches this namespace): the owner that
    lets kwok complete the raw Pods and keeps the garbage collector from deleting them."""
    owner = bench.custom.create_namespaced_custom_object(
        ARGO_GROUP,
        ARGO_VERSION,
        namespace,
        ARGO_PLURAL,
        {
            "apiVersion": f"{ARGO_GROUP}/{ARGO_VERSION}",
            "kind": "Workflow",
            "metadata": {"name": "raw-owner"},
            "spec": {"entrypoint": "none", "templates": [{"name": "none", "suspend": {}}]},
        },
    )
    return {
        "apiVersion": f"{ARGO_GROUP}/{ARGO_VERSION}",
        "kind": "Workflow",
        "name": "raw-owner",
        "uid": owner["metadata"]["uid"],
    }


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def show(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def print_cluster(
    label: str,
    turns: list[Turn],
    raw_jobs: list[float],
    raw_pods: list[float],
    *,
    raw_job_cpu: list[float],
) -> None:
    print(f"\n== {label}")
    print(
        f"raw ceilings: Jobs/min {', '.join(f'{v:.0f}' for v in raw_jobs)}; "
        f"Pods/min {', '.join(f'{v:.0f}' for v in raw_pods)} (per round; plain client, "
        "16 concurrent creations, kwok completes)"
    )
    header = (
        f"{'engine':<11}{'round':>6}{'runs/min':>10}{'hand-off p50/p99/max ms':>25}"
        f"{'DAG s':>8}{'fail->final s':>15}{'writes/task':>13}{'CPU s/task':>12}"
        f"{'cluster CPU':>13}  failing run"
    )
    print(
        "writes/task: apiserver_request_total writes (every client of the cluster) per task "
        "Pod finished in the turn; CPU s/task: the controller process (FlowForge: operator + "
        "its PostgreSQL server) per task Pod; cluster CPU: the control plane's processes "
        "(apiserver, etcd, controller manager, scheduler, kwok) per task Pod"
    )
    print(header)
    for turn in turns:
        latencies = turn.handoffs
        hand = (
            "/".join(
                f"{v * 1000:.0f}"
                for v in (percentile(latencies, 0.5), percentile(latencies, 0.99), max(latencies))
            )
            if latencies
            else "-"
        )
        writes = sum(turn.writes.values())
        print(
            f"{turn.engine:<11}{turn.round:>6}{show(turn.throughput):>10}{hand:>25}"
            f"{show(turn.makespan, digits=1):>8}{show(turn.failing, digits=1):>15}"
            f"{show(writes / turn.tasks if turn.tasks else None, digits=1):>13}"
            f"{show(turn.cpu / turn.tasks if turn.tasks else None, digits=4):>12}"
            f"{show(turn.cluster_cpu / turn.tasks if turn.tasks else None, digits=4):>13}"
            f"  {turn.failing_note}"
        )
    for turn in turns:
        print(
            f"  {turn.engine} round {turn.round}: DAG run object "
            f"{show(turn.dag_object_kib, ' KiB', 1)}, controller peak RSS "
            f"{show(turn.peak_rss_mib, ' MiB', 0)}"
        )
    print("medians over rounds, and ratios against flowforge (x > 1: flowforge better):")
    summary = summarise(turns)
    base = summary.get("flowforge", {})
    jobs, pods = median(raw_jobs), median(raw_pods)
    for engine, figures in summary.items():
        share = (
            figures["runs/min"] / (jobs if engine == "flowforge" else pods)
            if (figures["runs/min"] is not None and jobs and pods)
            else None
        )
        ratios = []
        for key in figures:
            mine, ours = figures[key], base.get(key)
            if engine != "flowforge" and mine and ours:
                ratios.append(f"{key} x{(ours / mine if key == 'runs/min' else mine / ours):.2f}")
        print(
            f"  {engine:<11}"
            + ", ".join(
                f"{key} {show(value, digits=3 if 'CPU' in key else 1)}"
                for key, value in figures.items()
            )
            + (
                f"; {share:.0%} of the raw {'Job' if engine == 'flowforge' else 'Pod'} ceiling"
                if share
                else ""
            )
            + (f"; {', '.join(ratios)}" if ratios else "")
        )
    print_cpu_bound(turns, summary, raw_job_cpu=median(raw_job_cpu), raw_jobs=jobs)
    for engine in summary:
        print_writes(engine, [turn for turn in turns if turn.engine == engine])


def print_writes(engine: str, turns: list[Turn]) -> None:
    """Writes per task by verb and resource, Events by who reported them, and FlowForge's
    own writes (its Events counted as created, one POST each: a series Event's later
    updates are not told apart from other clients' Event PATCHes)."""
    counts: Counter[tuple[str, str]] = Counter()
    events: Counter[str] = Counter()
    for turn in turns:
        counts.update(turn.writes)
        events.update(turn.events)
    tasks = sum(turn.tasks for turn in turns)
    if not tasks:
        return
    every = ", ".join(
        f"{verb} {resource} {count / tasks:.2f}" for (verb, resource), count in counts.most_common()
    )
    print(f"  {engine} writes per task by verb and resource: {every}")
    reporters = ", ".join(f"{source} {count / tasks:.2f}" for source, count in events.most_common())
    print(f"  {engine} Events created per task by reporter: {reporters}")
    if engine != "flowforge":
        return
    own = Counter({key: count for key, count in counts.items() if key in FLOWFORGE_WRITES})
    own[("POST", f"events ({FLOWFORGE_COMPONENT})")] = events[FLOWFORGE_COMPONENT]
    listed = ", ".join(
        f"{verb} {resource} {count / tasks:.2f}" for (verb, resource), count in own.most_common()
    )
    print(f"  flowforge's own writes per task: {sum(own.values()) / tasks:.2f} ({listed})")


def print_cpu_bound(
    turns: list[Turn],
    summary: dict[str, dict[str, float | None]],
    *,
    raw_job_cpu: float | None,
    raw_jobs: float | None,
) -> None:
    """What this machine's cores allow at most, from the CPU a single-task run costs (over
    that workload alone): the control plane's share plus the controller's (the bench's own
    client is left out of both)."""
    cores = os.cpu_count() or 1
    if raw_job_cpu and raw_jobs:
        print(
            f"  CPU bound on {cores} cores: a raw Job costs the cluster {raw_job_cpu:.4f} s, "
            f"so at most {cores * 60 / raw_job_cpu:.0f} Jobs/min (measured {raw_jobs:.0f})"
        )
    for engine, figures in summary.items():
        costs = [t.single_cpu for t in turns if t.engine == engine and t.single_cpu]
        controller = median([c[0] for c in costs])
        cluster = median([c[1] for c in costs])
        if controller and cluster and figures["runs/min"]:
            bound = cores * 60 / (controller + cluster)
            print(
                f"  CPU bound on {cores} cores: a {engine} single-task run costs {cluster:.4f} s "
                f"of the cluster + {controller:.4f} s of its controller, so at most "
                f"{bound:.0f} runs/min (measured {figures['runs/min']:.0f})"
            )


def summarise(turns: list[Turn]) -> dict[str, dict[str, float | None]]:
    summary: dict[str, dict[str, float | None]] = {}
    for engine in dict.fromkeys(turn.engine for turn in turns):
        mine = [turn for turn in turns if turn.engine == engine]

        def pick(value: Callable[[Turn], float | None], mine: list[Turn] = mine) -> float | None:
            return median([v for turn in mine if (v := value(turn)) is not None])

        summary[engine] = {
            "runs/min": pick(lambda t: t.throughput),
            "hand-off p99 ms": pick(
                lambda t: percentile(t.handoffs, 0.99) * 1000 if t.handoffs else None
            ),
            "DAG s": pick(lambda t: t.makespan),
            "fail->final s": pick(lambda t: t.failing),
            "writes/task": pick(lambda t: sum(t.writes.values()) / t.tasks if t.tasks else None),
            "CPU s/task": pick(lambda t: t.cpu / t.tasks if t.tasks else None),
            "cluster CPU s/task": pick(lambda t: t.cluster_cpu / t.tasks if t.tasks else None),
        }
    return summary


def make_engine(name: str) -> Engine:
    return FlowForge() if name == "flowforge" else Argo(tuned=name == "argo-tuned")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument("--rounds", type=int, default=2, help="turns of every engine (A B A B)")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="subset of " + ",".join(WORKLOADS)
    )
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help="subset of " + ",".join(ENGINES)
    )
    parser.add_argument(
        "--controller-manager-qps",
        default="default,200",
        help="one cluster per value: kube-controller-manager's client QPS ('default': 20/s)",
    )
    for size in ("runs", "chains", "dag_tasks", "raw"):
        parser.add_argument(
            f"--{size.replace('_', '-')}", type=int, help=f"override the {size} size"
        )
    parser.add_argument(
        "--step-seconds",
        type=float,
        help="how long every task's Pod runs, for both engines (default 2; 0: at once)",
    )
    args = parser.parse_args()
    sizes = dataclasses.replace(
        QUICK if args.quick else FULL,
        **{
            size: getattr(args, size)
            for size in ("runs", "chains", "dag_tasks", "raw", "step_seconds")
            if getattr(args, size) is not None
        },
    )
    workloads = [w for w in args.workloads.split(",") if w]
    engines = [e for e in args.engines.split(",") if e]
    for name in workloads:
        if name not in WORKLOADS:
            parser.error(f"--workloads: unknown workload {name!r}")
    for name in engines:
        if name not in ENGINES:
            parser.error(f"--engines: unknown engine {name!r}")
    if any(name.startswith("argo") for name in engines):
        argo_controller()  # build before any cluster starts

    print(
        f"sizes: {sizes.runs} single-task runs, {sizes.chains} chains of {CHAIN_LENGTH}, "
        f"{sizes.dag_tasks}-task DAG, {sizes.raw} raw Jobs/Pods; every step's Pod runs "
        f"{sizes.step_seconds:g} s; {args.rounds} rounds; "
        f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
    )
    work = work_directory("flowforge-peer-")
    cluster_dir: Path | None = None
    try:
        argo_crds = sorted(
            (argo_module() / "manifests" / "base" / "crds" / "minimal").glob("argoproj.io_*.yaml")
        )
        for setting in args.controller_manager_qps.split(","):
            qps = None if setting == "default" else int(setting)
            cluster_dir = work / f"cluster-{setting}"
            bench = start_bench(
                work,
                cluster_dir=cluster_dir,
                controller_manager_qps=qps,
                extra_stages=[PEER / "argo-stages.yaml"],
            )
            bench.install_crds(argo_crds)
            turns: list[Turn] = []
            raw_jobs: list[float] = []
            raw_pods: list[float] = []
            raw_job_cpu: list[float] = []
            for round_number in range(1, args.rounds + 1):
                namespace = bench.new_namespace("raw")
                cluster_cpu_before = bench.cluster_cpu()
                raw_jobs.append(raw_ceiling(bench.batch, namespace, sizes.raw))
                raw_job_cpu.append((bench.cluster_cpu() - cluster_cpu_before) / sizes.raw)
                raw_pods.append(
                    raw_pod_ceiling(
                        bench.core, namespace, sizes.raw, owner=raw_owner(bench, namespace)
                    )
                )
                # A B C, then C B A: drift over the run weighs on every engine alike
                for name in engines if round_number % 2 else engines[::-1]:
                    turn = run_turn(
                        make_engine(name),
                        bench=bench,
                        work=work,
                        sizes=sizes,
                        workloads=workloads,
                        round_number=round_number,
                    )
                    turns.append(turn)
                    print(
                        f"  [{time.strftime('%H:%M:%S')}] {setting}: {name} "
                        f"round {round_number} done",
                        flush=True,
                    )
            label = (
                "kube-controller-manager client limit: default (20 QPS, burst 30)"
                if qps is None
                else f"kube-controller-manager client limit lifted: {qps} QPS, burst {2 * qps}"
            )
            print_cluster(label, turns, raw_jobs, raw_pods, raw_job_cpu=raw_job_cpu)
            print(f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
            stop_cluster(cluster_dir)
            cluster_dir = None
        return 0
    finally:
        localdev_postgres.stop(work / "pg")
        if cluster_dir is not None:
            stop_cluster(cluster_dir)
        remove_work(work)


def argo_module() -> Path:
    """Argo's module source (its CRDs), from the Go module cache (downloaded when missing)."""
    version = (PEER / "versions.env").read_text().split("ARGO_VERSION=")[1].split()[0]
    downloaded = subprocess.run(
        ["go", "mod", "download", "-json", f"github.com/argoproj/argo-workflows/v4@{version}"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    return Path(json.loads(downloaded.stdout)["Dir"])


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # run the finally blocks: stop the cluster and servers


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(main())
