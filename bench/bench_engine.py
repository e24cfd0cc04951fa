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

With ``--tracing-rounds N`` it compares tracing off and on instead (issue 25/7: within 5%):
2N rounds interleaved off, on, on, off, ... each with a fresh operator (on: sending every
finished run's trace over OTLP/HTTP to a sink on 127.0.0.1 that accepts and drops them), each
round's single-task throughput and chain hand-off p99 measured as above; it prints the medians
per mode and the ratios on/off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import http.server
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from flowforge.domain.api import API_VERSION, GROUP, RUN_KIND, RUN_PLURAL, VERSION
from flowforge.domain.validation import parse_definition
from flowforge.localdev import postgres as localdev_postgres
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import start_cluster, stop_cluster
from flowforge.store.definitions import publish_definition
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool

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


@dataclasses.dataclass
class Bench:
    """One benchmark's cluster, PostgreSQL and namespace (``bench_environment``)."""

    work: Path
    dsn: str
    kubeconfig: Path
    namespace: str
    core: k8s.CoreV1Api
    batch: k8s.BatchV1Api
    custom: k8s.CustomObjectsApi
    operator: subprocess.Popen[bytes] | None = None

    async def publish(self, *specs: dict[str, Any]) -> None:
        pool = await open_pool(self.dsn, min_size=1, max_size=2)
        for spec in specs:
            await publish_definition(
                pool, namespace=self.namespace, definition=parse_definition(spec)
            )
        await pool.close()

    def start_operator(self, *, env: dict[str, str] | None = None) -> None:
        log = (self.work / "operator.log").open("wb")
        self.operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowforge.operator",
                "--dsn",
                self.dsn,
                "--namespace",
                self.namespace,
                "--kubeconfig",
                str(self.kubeconfig),
                "--job-ttl",
                "-1",
                "--identity",
                "bench",
                "--metrics-port",
                str(METRICS_PORT),
            ],
            env={**os.environ, "FLOWFORGE_JOB_CREATION_QPS": "200", **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        time.sleep(8)

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.send_signal(signal.SIGTERM)
            try:
                self.operator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.operator.kill()
            self.operator = None

    def create_runs(self, prefix: str, workflow: str, count: int, **spec: Any) -> list[str]:
        names = [f"{prefix}-{i:03d}" for i in range(count)]

        def create(name: str) -> None:
            self.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                RUN_PLURAL,
                {
                    "apiVersion": API_VERSION,
                    "kind": RUN_KIND,
                    "metadata": {"name": name},
                    "spec": {"workflow": workflow, "version": 1, **spec},
                },
            )

        threads = [threading.Thread(target=create, args=(name,)) for name in names]
        for index in range(0, len(threads), 16):
            for thread in threads[index : index + 16]:
                thread.start()
            for thread in threads[index : index + 16]:
                thread.join()
        return names

    def wait_finished(
        self, names: list[str], timeout: float, *, poll: float = 0.25
    ) -> dict[str, str]:
        """Poll the runs' phases (a LIST of every run is heavy for the apiserver: the
        interval bounds the throughput figure's error, 0.25 s in 60 s)."""
        deadline = time.monotonic() + timeout
        wanted = set(names)
        phases: dict[str, str] = {}
        while time.monotonic() < deadline:
            runs = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, RUN_PLURAL
            )
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


@contextlib.asynccontextmanager
async def bench_environment(
    *, cluster_dir: Path | None, controller_manager_qps: int | None = None
) -> AsyncIterator[Bench]:
    """A local cluster (or the running one in ``cluster_dir``), a PostgreSQL server, the
    WorkflowRun CRD and a fresh namespace; stopped (and the operator too) on the way out."""
    work = Path(tempfile.mkdtemp(prefix="flowforge-bench-"))
    work.chmod(0o755)  # the PostgreSQL server account must reach work/pg
    own_cluster = cluster_dir is None
    cluster_dir = cluster_dir or work / "cluster"
    bench: Bench | None = None
    try:
        cluster = start_cluster(
            state_dir=cluster_dir, controller_manager_qps=controller_manager_qps
        )
        postgres = localdev_postgres.start(
            work / "pg", settings={"fsync": "off", "synchronous_commit": "off"}
        )
        await migrate(postgres.dsn)
        configuration = k8s.Configuration()
        k8s_config.load_kube_config(
            config_file=str(cluster.kubeconfig),  # type: ignore[no-untyped-call]
            client_configuration=configuration,
        )
        configuration.connection_pool_maxsize = 32
        api = k8s.ApiClient(configuration)
        extensions = k8s.ApiextensionsV1Api(api)
        for path in sorted((repo_root() / "crds").glob("*.flowforge.io.yaml")):
            body = yaml.safe_load(path.read_text())
            try:
                extensions.create_custom_resource_definition(body)
            except k8s.ApiException as error:
                if error.status != 409:
                    raise
        time.sleep(2)
        core = k8s.CoreV1Api(api)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
        while True:
            try:
                core.read_namespaced_service_account("default", namespace)
                break
            except k8s.ApiException:
                time.sleep(0.2)
        bench = Bench(
            work=work,
            dsn=postgres.dsn,
            kubeconfig=cluster.kubeconfig,
            namespace=namespace,
            core=core,
            batch=k8s.BatchV1Api(api),
            custom=k8s.CustomObjectsApi(api),
        )
        yield bench
    finally:
        if bench is not None and bench.operator is not None:
            bench.operator.send_signal(signal.SIGTERM)
            try:
                bench.operator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                bench.operator.kill()
        localdev_postgres.stop(work / "pg")
        if own_cluster:
            stop_cluster(cluster_dir)
        if os.environ.get("FLOWFORGE_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


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
    parser.add_argument(
        "--tracing-rounds",
        type=int,
        default=0,
        help="compare tracing off and on: this many rounds of each, interleaved",
    )
    args = parser.parse_args()
    if args.tracing_rounds:
        return await tracing_comparison(args)
    async with bench_environment(
        cluster_dir=args.cluster_dir, controller_manager_qps=args.controller_manager_qps
    ) as bench:
        batch, namespace = bench.batch, bench.namespace
        ceiling = raw_ceiling(batch, namespace, args.jobs)
        print(
            f"raw ceiling: {ceiling:.0f} Jobs/min created and completed "
            f"({args.jobs} Jobs, plain client, 16 concurrent creations)"
        )
        await bench.publish(
            {
                "workflow": "single",
                "version": 1,
                "taskTypes": {"step": STEP},
                "tasks": [{"key": "only", "type": "step"}],
            },
            chain_definition(args.chain_length),
        )
        bench.start_operator()

        # warm-up: one run through every path
        bench.wait_finished(bench.create_runs("warm", "chain", 1), 120)

        started = time.monotonic()
        names = bench.create_runs("single", "single", args.runs)
        phases = bench.wait_finished(names, 600)
        elapsed = time.monotonic() - started
        throughput = len(names) / elapsed * 60
        assert set(phases.values()) == {"Succeeded"}, phases
        print(
            f"single-task runs: {throughput:.0f} runs/min completed ({len(names)} runs in "
            f"{elapsed:.1f} s) = {throughput / ceiling:.0%} of the raw ceiling (target >= 80%)"
        )

        watcher = JobWatcher(batch, namespace)
        names = bench.create_runs("chain", "chain", args.chains)
        bench.wait_finished(names, 600, poll=2)
        time.sleep(1)
        watcher.close()
        handoffs = chain_handoffs(watcher, names, length=args.chain_length)
        latencies = [latency for latency, _ in handoffs]
        expected = args.chains * (args.chain_length - 1)
        print(
            f"hand-off latency, {len(latencies)} of {expected} hand-offs in "
            f"{args.chains} concurrent runs: {figures(latencies)} (target p99 < 250 ms)"
        )
        print(operator_handoff())
        print(
            "slowest: "
            + ", ".join(
                f"{where} {latency * 1000:.0f} ms" for latency, where in sorted(handoffs)[-3:]
            )
        )
        return 0


class _OtlpSink(http.server.BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP exports and drops them (an empty ExportTraceServiceResponse)."""

    spans_bytes = 0

    def do_POST(self) -> None:
        _OtlpSink.spans_bytes += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


async def tracing_comparison(args: argparse.Namespace) -> int:
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    tracing_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}",
        "OTEL_SERVICE_NAME": "flowforge-bench",
    }
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    async with bench_environment(
        cluster_dir=args.cluster_dir, controller_manager_qps=args.controller_manager_qps
    ) as bench:
        await bench.publish(
            {
                "workflow": "single",
                "version": 1,
                "taskTypes": {"step": STEP},
                "tasks": [{"key": "only", "type": "step"}],
            },
            chain_definition(args.chain_length),
        )
        order = [False, True, True, False] * ((args.tracing_rounds + 1) // 2)
        for index, traced in enumerate(order[: 2 * args.tracing_rounds]):
            bench.start_operator(env=tracing_env if traced else None)
            bench.wait_finished(bench.create_runs(f"warm{index}", "chain", 1), 120)
            started = time.monotonic()
            names = bench.create_runs(f"single{index}", "single", args.runs)
            bench.wait_finished(names, 600)
            throughput = len(names) / (time.monotonic() - started) * 60
            watcher = JobWatcher(bench.batch, bench.namespace)
            names = bench.create_runs(f"chain{index}", "chain", args.chains)
            bench.wait_finished(names, 600, poll=2)
            time.sleep(1)
            watcher.close()
            latencies = [lat for lat, _ in chain_handoffs(watcher, names, length=args.chain_length)]
            p99 = percentile(latencies, 0.99)
            results[traced].append((throughput, p99))
            bench.stop_operator()
            print(
                f"round {index + 1} tracing {'on ' if traced else 'off'}: "
                f"{throughput:.0f} runs/min, hand-off p99 {p99 * 1000:.0f} ms"
            )
    sink.shutdown()
    off_rate = statistics.median(rate for rate, _ in results[False])
    on_rate = statistics.median(rate for rate, _ in results[True])
    off_p99 = statistics.median(p99 for _, p99 in results[False])
    on_p99 = statistics.median(p99 for _, p99 in results[True])
    print(
        f"medians of {args.tracing_rounds} rounds each: throughput off {off_rate:.0f}, "
        f"on {on_rate:.0f} runs/min (on/off {on_rate / off_rate:.3f}); hand-off p99 off "
        f"{off_p99 * 1000:.0f}, on {on_p99 * 1000:.0f} ms (on/off {on_p99 / off_p99:.3f}); "
        f"{_OtlpSink.spans_bytes} bytes of OTLP received (target: within 5%)"
    )
    return 0


def chain_definition(length: int, *, workflow: str = "chain") -> dict[str, Any]:
    """t0 -> t1 -> ... -> t(length-1)."""
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"step": STEP},
        "tasks": [{"key": "t0", "type": "step"}]
        + [{"key": f"t{n}", "type": "step", "dependsOn": [f"t{n - 1}"]} for n in range(1, length)],
    }


def chain_handoffs(
    watcher: JobWatcher, names: list[str], *, length: int
) -> list[tuple[float, str]]:
    """Each t(n-1) -> t(n) of each chain run: its Job seen complete -> the next seen created."""
    by_run: dict[str, dict[str, str]] = {}
    for job, labels in watcher.labels.items():
        by_run.setdefault(labels.get("flowforge.io/run", ""), {})[
            labels.get("flowforge.io/task", "")
        ] = job
    handoffs: list[tuple[float, str]] = []
    for name in names:
        jobs = by_run.get(name, {})
        for n in range(1, length):
            upstream, dependent = jobs.get(f"t{n - 1}"), jobs.get(f"t{n}")
            if upstream in watcher.completed and dependent in watcher.created:
                handoffs.append(
                    (
                        watcher.created[dependent] - watcher.completed[upstream],
                        f"{name} t{n - 1}->t{n}",
                    )
                )
    return handoffs


def figures(latencies: list[float]) -> str:
    return (
        f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms, "
        f"mean {statistics.fmean(latencies) * 1000:.0f} ms"
    )


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # run the finally blocks: stop the cluster and servers


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(asyncio.run(main()))
