"""A local control plane (kwok) with FlowForge's CRDs, a local PostgreSQL and API clients."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from flowforge.localdev import postgres as localdev_postgres
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, start_cluster, stop_cluster
from flowforge.store.migrate import migrate
from harness.processes import (
    BENCH_OPERATOR_ENV,
    PROFILE_DIR,
    cluster_cpu_seconds,
    start_operator,
    stop_process,
)
from harness.runs import create_runs, publish, wait_finished


@dataclasses.dataclass
class Bench:
    """A local cluster with FlowForge's CRDs, a PostgreSQL server and API clients."""

    work: Path
    cluster: Cluster
    cluster_dir: Path
    dsn: str
    postgres_dir: Path
    api: k8s.ApiClient
    core: k8s.CoreV1Api
    batch: k8s.BatchV1Api
    custom: k8s.CustomObjectsApi

    @property
    def kubeconfig(self) -> Path:
        return Path(self.cluster.kubeconfig)

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


@dataclasses.dataclass
class BenchEnvironment:
    """A bench and the namespace its workload runs in (``bench_environment``), with the
    operator it runs, if any (stopped on the way out)."""

    bench: Bench
    namespace: str
    operator: subprocess.Popen[bytes] | None = None

    @property
    def work(self) -> Path:
        return self.bench.work

    @property
    def dsn(self) -> str:
        return self.bench.dsn

    @property
    def api(self) -> k8s.ApiClient:
        return self.bench.api

    @property
    def kubeconfig(self) -> Path:
        return self.bench.kubeconfig

    async def publish(self, *specs: dict[str, Any]) -> None:
        await publish(self.dsn, self.namespace, specs)

    def start_operator(
        self, *, metrics_port: int, extra_env: Mapping[str, str] | None = None
    ) -> None:
        self.operator = start_operator(
            dsn=self.dsn,
            kubeconfig=self.kubeconfig,
            namespace=self.namespace,
            log=self.work / "operator.log",
            metrics_port=metrics_port,
            extra_env={**BENCH_OPERATOR_ENV, **(extra_env or {})},
        )

    def stop_operator(self) -> None:
        stop_process(self.operator)
        self.operator = None

    def create_runs(self, prefix: str, workflow: str, count: int, **spec: Any) -> list[str]:
        return create_runs(self.bench.custom, self.namespace, prefix, workflow, count, **spec)

    def wait_finished(
        self, names: list[str], timeout: float, *, poll: float = 0.25
    ) -> dict[str, str]:
        return wait_finished(self.bench.custom, self.namespace, names, timeout, poll=poll)


def start_bench(
    work: Path,
    *,
    cluster_dir: Path,
    controller_manager_qps: int | None = None,
    extra_stages: Sequence[Path] = (),
    postgres_settings: Mapping[str, str] | None = None,
    pool_size: int = 32,
) -> Bench:
    """A cluster in ``cluster_dir`` (a running one is reused) and a PostgreSQL server in
    ``work/pg``, with every CRD of FlowForge's (the operator reads FlowForgePolicy objects
    before a namespace's first run)."""
    cluster = start_cluster(
        state_dir=cluster_dir,
        controller_manager_qps=controller_manager_qps,
        extra_stages=extra_stages,
    )
    settings = {"fsync": "off", "synchronous_commit": "off", **(postgres_settings or {})}
    if PROFILE_DIR:  # count the statements the operator sends (Profiler.statements)
        settings["shared_preload_libraries"] = "pg_stat_statements"
    postgres = localdev_postgres.start(work / "pg", settings=settings)
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(
        config_file=str(cluster.kubeconfig),  # type: ignore[no-untyped-call]
        client_configuration=configuration,
    )
    configuration.connection_pool_maxsize = pool_size
    api = k8s.ApiClient(configuration)
    bench = Bench(
        work=work,
        cluster=cluster,
        cluster_dir=cluster_dir,
        dsn=postgres.dsn,
        postgres_dir=postgres.directory,
        api=api,
        core=k8s.CoreV1Api(api),
        batch=k8s.BatchV1Api(api),
        custom=k8s.CustomObjectsApi(api),
    )
    bench.install_crds(sorted((repo_root() / "crds").glob("*.yaml")))
    return bench


def work_directory(prefix: str = "flowforge-bench-") -> Path:
    work = Path(tempfile.mkdtemp(prefix=prefix))
    work.chmod(0o755)  # the PostgreSQL server account must reach work/pg
    return work


def remove_work(work: Path) -> None:
    """``FLOWFORGE_BENCH_KEEP`` keeps the work directory (logs, profiles) to read after."""
    if os.environ.get("FLOWFORGE_BENCH_KEEP"):
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def local_postgres(*, settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """A PostgreSQL server of its own (no cluster); yields its DSN, removed afterwards."""
    work = work_directory("flowforge-bench-pg-")
    try:
        yield localdev_postgres.start(work / "pg", settings=dict(settings or {})).dsn
    finally:
        localdev_postgres.stop(work / "pg")
        shutil.rmtree(work, ignore_errors=True)


@contextlib.asynccontextmanager
async def bench_environment(
    *,
    cluster_dir: Path | None = None,
    controller_manager_qps: int | None = None,
    postgres_settings: Mapping[str, str] | None = None,
    pool_size: int = 32,
) -> AsyncIterator[BenchEnvironment]:
    """A bench (its own cluster, or the running one in ``cluster_dir``) with a migrated
    PostgreSQL and a fresh namespace; all torn down after."""
    work = work_directory()
    own_cluster = work / "cluster"
    environment: BenchEnvironment | None = None
    try:
        bench = start_bench(
            work,
            cluster_dir=cluster_dir or own_cluster,
            controller_manager_qps=controller_manager_qps,
            postgres_settings=postgres_settings,
            pool_size=pool_size,
        )
        await migrate(bench.dsn)
        environment = BenchEnvironment(bench=bench, namespace=bench.new_namespace())
        yield environment
    finally:
        if environment is not None:
            environment.stop_operator()
        localdev_postgres.stop(work / "pg")
        if cluster_dir is None:
            stop_cluster(own_cluster)
        remove_work(work)


@contextlib.contextmanager
def baseline_checkout(ref: str) -> Iterator[Path]:
    """A detached ``git worktree`` of ``ref`` (e.g. main) to run the old code from; yields
    its ``operator/`` directory (what PYTHONPATH needs), removed afterwards."""
    root = repo_root()
    target = Path(tempfile.mkdtemp(prefix="flowforge-baseline-")) / "checkout"
    subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "--detach", "--quiet", str(target), ref],
        check=True,
    )
    try:
        yield target / "operator"
    finally:
        subprocess.run(
            ["git", "-C", str(root), "worktree", "remove", "--force", str(target)], check=False
        )
        shutil.rmtree(target.parent, ignore_errors=True)


def exit_on_sigterm() -> None:
    """Make SIGTERM run the ``finally`` blocks: stop the cluster and servers."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
