"""What bench_peer.py (FlowForge beside Argo Workflows) runs on: a local cluster with
PostgreSQL and clients, watchers that time Jobs and Pods, the raw ceilings of a plain client,
the FlowForge operator as a subprocess, its runs, percentiles, and the apiserver's and a
process's own counters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from flowforge.domain.api import API_VERSION, GROUP, RUN_KIND, RUN_PLURAL, VERSION
from flowforge.domain.validation import parse_definition
from flowforge.localdev import postgres as localdev_postgres
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, start_cluster
from flowforge.store.definitions import publish_definition
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool

STEP = {"image": "busybox:1.36"}
FINISHED_RUN = ("Succeeded", "Failed", "Cancelled")
CONCURRENT_CREATIONS = 16


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def in_groups(action: Callable[[Any], object], items: Iterable[Any]) -> None:
    """``action`` on every item, CONCURRENT_CREATIONS threads at a time."""
    threads = [threading.Thread(target=action, args=(item,)) for item in items]
    for index in range(0, len(threads), CONCURRENT_CREATIONS):
        group = threads[index : index + CONCURRENT_CREATIONS]
        for thread in group:
            thread.start()
        for thread in group:
            thread.join()


def job_complete(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


def pod_finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class Watcher:
    """Times when each object (Jobs, Pods or runs of one namespace) was first seen created and
    first seen finished, and its latest ``status.phase``.

    Reads the watch stream as raw JSON lines (no model classes): the instrument must not
    compete for the CPU it measures.
    """

    def __init__(
        self,
        lister: Callable[..., Any],
        namespace: str,
        *,
        finished: Callable[[dict[str, Any]], bool],
    ) -> None:
        self.created: dict[str, float] = {}
        self.completed: dict[str, float] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.annotations: dict[str, dict[str, str]] = {}
        self.phases: dict[str, str] = {}
        self._lister = lister
        self._namespace = namespace
        self._finished = finished
        self._stop = threading.Event()
        listing = json.loads(lister(namespace, _preload_content=False).data)
        self._version = listing["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            response = self._lister(
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
                item = event["object"]
                self._version = item["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                name = item["metadata"]["name"]
                self.created.setdefault(name, now)
                self.labels[name] = item["metadata"].get("labels") or {}
                self.annotations[name] = item["metadata"].get("annotations") or {}
                self.phases[name] = (item.get("status") or {}).get("phase", "")
                if self._finished(item):
                    self.completed.setdefault(name, now)
            response.release_conn()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def job_watcher(batch: k8s.BatchV1Api, namespace: str) -> Watcher:
    return Watcher(batch.list_namespaced_job, namespace, finished=job_complete)


def pod_watcher(core: k8s.CoreV1Api, namespace: str) -> Watcher:
    return Watcher(core.list_namespaced_pod, namespace, finished=pod_finished)


def run_watcher(
    custom: k8s.CustomObjectsApi,
    namespace: str,
    resource: tuple[str, str, str],
    *,
    final: Sequence[str],
) -> Watcher:
    """The phases of an engine's runs, from one watch: polling with a LIST of every run would
    cost the apiserver more than some engines do (and more for bigger run objects)."""
    group, version, plural = resource

    def lister(namespace: str, **options: Any) -> Any:
        return custom.list_namespaced_custom_object(group, version, namespace, plural, **options)

    return Watcher(
        lister,
        namespace,
        finished=lambda run: (run.get("status") or {}).get("phase") in final,
    )


def _plain_pod_spec() -> dict[str, Any]:
    return {"restartPolicy": "Never", "containers": [{"name": "task", "image": "busybox:1.36"}]}


def raw_ceiling(batch: k8s.BatchV1Api, namespace: str, count: int) -> float:
    """Jobs per minute a plain client gets created and completed by kwok."""
    return _raw_rate(
        job_watcher(batch, namespace),
        count,
        lambda name: batch.create_namespaced_job(
            namespace,
            {
                "metadata": {"name": name, "labels": {"bench": "raw"}},
                "spec": {"backoffLimit": 0, "template": {"spec": _plain_pod_spec()}},
            },
        ),
    )


def raw_pod_ceiling(
    core: k8s.CoreV1Api, namespace: str, count: int, *, owner: dict[str, Any]
) -> float:
    """Pods per minute a plain client gets created and completed by kwok. ``owner``: the
    ownerReference of a kind kwok completes (a Pod of no owner keeps running)."""
    return _raw_rate(
        pod_watcher(core, namespace),
        count,
        lambda name: core.create_namespaced_pod(
            namespace,
            {"metadata": {"name": name, "ownerReferences": [owner]}, "spec": _plain_pod_spec()},
        ),
    )


def _raw_rate(watcher: Watcher, count: int, create: Callable[[str], object]) -> float:
    prefix = f"raw-{uuid.uuid4().hex[:5]}"
    started = time.monotonic()
    in_groups(lambda index: create(f"{prefix}-{index}"), range(count))
    while sum(1 for name in watcher.completed if name.startswith(prefix)) < count:
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    watcher.close()
    return count / elapsed * 60


@dataclass
class Bench:
    """A local cluster with FlowForge's CRDs, a PostgreSQL server and API clients."""

    cluster: Cluster
    cluster_dir: Path
    dsn: str
    postgres_dir: Path
    api: k8s.ApiClient
    core: k8s.CoreV1Api
    batch: k8s.BatchV1Api
    custom: k8s.CustomObjectsApi

    def cluster_cpu(self) -> float:
        return cluster_cpu_seconds(self.cluster_dir)

    def install_crds(self, paths: Iterable[Path]) -> None:
        extensions = k8s.ApiextensionsV1Api(self.api)
        for path in paths:
            try:
                extensions.create_custom_resource_definition(yaml.safe_load(path.read_text()))
            except k8s.ApiException as error:
                if error.status != 409:
                    raise
        time.sleep(2)

    def new_namespace(self, prefix: str = "bench") -> str:
        namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": namespace}})
        while True:
            try:
                self.core.read_namespaced_service_account("default", namespace)
                return namespace
            except k8s.ApiException:
                time.sleep(0.2)

    def apiserver_requests(self) -> Counter[tuple[str, str]]:
        """The apiserver's own ``apiserver_request_total``, summed by (verb, resource[/sub])."""
        response = self.api.call_api("GET", f"{self.api.configuration.host}/metrics")
        text = response.read().decode()
        counts: Counter[tuple[str, str]] = Counter()
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels_text, value = line[len("apiserver_request_total{") :].rsplit("} ", 1)
            labels = dict(part.split("=", 1) for part in labels_text.split('",') if "=" in part)
            labels = {key: raw.strip('"') for key, raw in labels.items()}
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            counts[(labels.get("verb", ""), resource)] += int(float(value))
        return counts


PROFILE_DIR = os.environ.get("FLOWFORGE_BENCH_PROFILE", "")


def start_bench(
    work: Path,
    *,
    cluster_dir: Path,
    controller_manager_qps: int | None = None,
    extra_stages: Sequence[Path] = (),
) -> Bench:
    cluster = start_cluster(
        state_dir=cluster_dir,
        controller_manager_qps=controller_manager_qps,
        extra_stages=extra_stages,
    )
    settings = {"fsync": "off", "synchronous_commit": "off"}
    if PROFILE_DIR:  # count the statements the operator sends (Profiler.statements)
        settings["shared_preload_libraries"] = "pg_stat_statements"
    postgres = localdev_postgres.start(work / "pg", settings=settings)
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(
        config_file=str(cluster.kubeconfig),  # type: ignore[no-untyped-call]
        client_configuration=configuration,
    )
    configuration.connection_pool_maxsize = 32
    api = k8s.ApiClient(configuration)
    bench = Bench(
        cluster=cluster,
        cluster_dir=cluster_dir,
        dsn=postgres.dsn,
        postgres_dir=postgres.directory,
        api=api,
        core=k8s.CoreV1Api(api),
        batch=k8s.BatchV1Api(api),
        custom=k8s.CustomObjectsApi(api),
    )
    bench.install_crds(sorted((repo_root() / "crds").glob("*.yaml")))  # the operator reads all
    return bench


async def publish(dsn: str, namespace: str, specs: Iterable[dict[str, Any]]) -> None:
    await migrate(dsn)
    pool = await open_pool(dsn, min_size=1, max_size=2)
    for spec in specs:
        await publish_definition(pool, namespace=namespace, definition=parse_definition(spec))
    await pool.close()


def start_operator(
    bench: Bench, namespace: str, *, log: Path, metrics_port: int
) -> subprocess.Popen[bytes]:
    operator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowforge.operator",
            "--dsn",
            bench.dsn,
            "--namespace",
            namespace,
            "--kubeconfig",
            str(bench.cluster.kubeconfig),
            "--job-ttl",
            "-1",
            "--identity",
            "bench",
            "--metrics-port",
            str(metrics_port),
        ],
        env={**os.environ, "FLOWFORGE_JOB_CREATION_QPS": "200"},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    if PROFILE_DIR:
        Profiler.sample(operator.pid, Path(PROFILE_DIR) / f"operator-{namespace}.txt")
    time.sleep(8)
    return operator


class Profiler:
    """``FLOWFORGE_BENCH_PROFILE=DIR``: py-spy samples the operator's Python while it holds the
    GIL, that is its CPU time and not its waits (py-spy is its own process, so the CPU figures
    do not count it), into DIR, and PostgreSQL's pg_stat_statements counts the statements of
    the measured part of a turn (``begin`` .. ``report``)."""

    @staticmethod
    def sample(pid: int, output: Path) -> None:
        output.parent.mkdir(parents=True, exist_ok=True)
        py_spy = Path(sys.executable).parent / "py-spy"
        command = [str(py_spy), "record", "--nonblocking", "--gil", "-r", "50", "-f", "raw"]
        subprocess.Popen(
            [*command, "-o", str(output), "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # ends when the operator does

    @staticmethod
    def begin(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            connection.execute("SELECT pg_stat_statements_reset()")

    @staticmethod
    def report(dsn: str, *, tasks: int, output: Path) -> None:
        with psycopg.connect(dsn, autocommit=True) as connection:
            rows = connection.execute(
                "SELECT calls, total_exec_time, query FROM pg_stat_statements "
                "WHERE query NOT LIKE '%%pg_stat_statements%%' ORDER BY calls DESC"
            ).fetchall()
        lines = [
            f"{calls / max(tasks, 1):8.2f} calls/task {ms / max(tasks, 1):8.3f} ms/task  "
            + " ".join(str(query).split())[:160]
            for calls, ms, query in rows
        ]
        total = sum(int(row[0]) for row in rows) / max(tasks, 1)
        output.write_text(f"{total:.2f} statements/task over {tasks} tasks\n" + "\n".join(lines))


def stop_process(process: subprocess.Popen[bytes] | None) -> None:
    if process is None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a running process and of every descendant, live or reaped,
    from /proc."""
    ticks = 0
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    pending = [pid]
    while pending:
        current = pending.pop()
        if current in stats:
            ticks += sum(int(value) for value in stats[current][11:15])
        pending.extend(children.get(current, []))
    return ticks / os.sysconf("SC_CLK_TCK")


def cluster_cpu_seconds(cluster_dir: Path) -> float:
    """CPU time so far of the control plane's own processes (kube-apiserver, etcd,
    kube-controller-manager, kube-scheduler, kwok): those whose command line names
    ``cluster_dir``, where kwokctl keeps their state."""
    marker = str(cluster_dir).encode()
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "cmdline").read_bytes():
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        ticks += sum(int(value) for value in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_pid(directory: Path) -> int:
    """The postmaster of the local server in ``directory`` (localdev_postgres.start's)."""
    return int((directory / "data" / "postmaster.pid").read_text().split()[0])


def create_runs(
    custom: k8s.CustomObjectsApi, namespace: str, prefix: str, workflow: str, count: int
) -> list[str]:
    names = [f"{prefix}-{i:03d}" for i in range(count)]
    in_groups(
        lambda name: custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            RUN_PLURAL,
            {
                "apiVersion": API_VERSION,
                "kind": RUN_KIND,
                "metadata": {"name": name},
                "spec": {"workflow": workflow, "version": 1},
            },
        ),
        names,
    )
    return names


def wait_phases(
    list_phases: Callable[[], dict[str, str]],
    names: list[str],
    timeout: float,
    *,
    poll: float = 0.25,
    final: Sequence[str] = FINISHED_RUN,
) -> dict[str, str]:
    """Poll the runs' phases until every one of ``names`` is final (a LIST of every run is
    heavy for the apiserver: the interval bounds the throughput figure's error, 0.25 s in
    60 s)."""
    deadline = time.monotonic() + timeout
    wanted = set(names)
    phases: dict[str, str] = {}
    while time.monotonic() < deadline:
        phases = {name: phase for name, phase in list_phases().items() if name in wanted}
        if len(phases) == len(wanted) and all(p in final for p in phases.values()):
            return phases
        time.sleep(poll)
    raise SystemExit(f"runs not finished in {timeout} s: {phases}")


def list_phases(
    custom: k8s.CustomObjectsApi, namespace: str, *, group: str, version: str, plural: str
) -> dict[str, str]:
    items = custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]
    return {item["metadata"]["name"]: (item.get("status") or {}).get("phase", "") for item in items}


def wait_finished(
    custom: k8s.CustomObjectsApi,
    namespace: str,
    names: list[str],
    timeout: float,
    *,
    poll: float = 0.25,
) -> dict[str, str]:
    return wait_phases(
        lambda: list_phases(custom, namespace, group=GROUP, version=VERSION, plural=RUN_PLURAL),
        names,
        timeout,
        poll=poll,
    )
