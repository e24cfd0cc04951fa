"""What the benchmarks share: a local control plane (kwok), a local PostgreSQL, FlowForge's
CRDs, a fresh namespace, and the real operator as a child process.

Everything binds 127.0.0.1; everything started here is stopped on the way out (SIGTERM to
the bench runs the ``finally`` blocks too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from flowforge.domain.api import API_VERSION, GROUP, RUN_KIND, RUN_PLURAL, VERSION
from flowforge.localdev import postgres as localdev_postgres
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import start_cluster, stop_cluster
from flowforge.store.migrate import migrate


@dataclasses.dataclass(frozen=True)
class BenchEnvironment:
    work: Path
    kubeconfig: Path
    dsn: str
    api: k8s.ApiClient
    namespace: str


def create_run_object(
    custom: k8s.CustomObjectsApi,
    namespace: str,
    name: str,
    *,
    workflow: str,
    finalizers: Sequence[str] = (),
) -> dict[str, Any]:
    """Create a WorkflowRun of ``workflow`` version 1; returns the created object."""
    metadata: dict[str, Any] = {"name": name}
    if finalizers:
        metadata["finalizers"] = list(finalizers)
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        RUN_PLURAL,
        {
            "apiVersion": API_VERSION,
            "kind": RUN_KIND,
            "metadata": metadata,
            "spec": {"workflow": workflow, "version": 1},
        },
    )
    return created


def new_namespace(api: k8s.ApiClient, prefix: str = "bench") -> str:
    core = k8s.CoreV1Api(api)
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return namespace
        except k8s.ApiException:
            time.sleep(0.2)


@contextlib.asynccontextmanager
async def bench_environment(
    *,
    cluster_dir: Path | None = None,
    controller_manager_qps: int | None = None,
    postgres_settings: Mapping[str, str] | None = None,
    pool_size: int = 32,
) -> AsyncIterator[BenchEnvironment]:
    """A cluster (or the running one in ``cluster_dir``), a migrated PostgreSQL, FlowForge's
    CRDs (the operator reads FlowForgePolicy objects before a namespace's first run) and a
    fresh namespace; all torn down after (FLOWFORGE_BENCH_KEEP keeps
    the work directory)."""
    work = Path(tempfile.mkdtemp(prefix="flowforge-bench-"))
    work.chmod(0o755)  # the PostgreSQL server account must reach work/pg
    own_cluster = work / "cluster"
    try:
        cluster = start_cluster(
            state_dir=cluster_dir or own_cluster, controller_manager_qps=controller_manager_qps
        )
        postgres = localdev_postgres.start(
            work / "pg",
            settings={"fsync": "off", "synchronous_commit": "off", **(postgres_settings or {})},
        )
        await migrate(postgres.dsn)
        configuration = k8s.Configuration()
        k8s_config.load_kube_config(
            config_file=str(cluster.kubeconfig),  # type: ignore[no-untyped-call]
            client_configuration=configuration,
        )
        configuration.connection_pool_maxsize = pool_size
        api = k8s.ApiClient(configuration)
        extensions = k8s.ApiextensionsV1Api(api)
        for path in sorted((repo_root() / "crds").glob("*.yaml")):
            try:
                extensions.create_custom_resource_definition(yaml.safe_load(path.read_text()))
            except k8s.ApiException as error:
                if error.status != 409:
                    raise
        time.sleep(2)
        yield BenchEnvironment(
            work=work,
            kubeconfig=Path(cluster.kubeconfig),
            dsn=postgres.dsn,
            api=api,
            namespace=new_namespace(api),
        )
    finally:
        localdev_postgres.stop(work / "pg")
        if cluster_dir is None:
            stop_cluster(own_cluster)
        if os.environ.get("FLOWFORGE_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def start_operator(
    env: BenchEnvironment,
    *,
    identity: str,
    metrics_port: int,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    python_path: Path | None = None,
    command: Sequence[str] | None = None,
) -> subprocess.Popen[bytes]:
    """The real operator (``python -m flowforge.operator``) on the bench's namespace, logging
    to ``work/operator-<identity>.log``; ``python_path``: run another checkout's code;
    ``command``: what runs it instead of ``python -m flowforge.operator`` (e.g. a probe)."""
    log = (env.work / f"operator-{identity}.log").open("wb")
    environment = {**os.environ, **(extra_env or {})}
    if python_path is not None:
        environment["PYTHONPATH"] = str(python_path)
    return subprocess.Popen(
        [
            *(command or (sys.executable, "-m", "flowforge.operator")),
            "--dsn",
            env.dsn,
            "--namespace",
            env.namespace,
            "--kubeconfig",
            str(env.kubeconfig),
            "--identity",
            identity,
            "--metrics-port",
            str(metrics_port),
            *extra_args,
        ],
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop_operator(operator: subprocess.Popen[bytes] | None) -> None:
    if operator is None or operator.poll() is not None:
        return
    operator.send_signal(signal.SIGTERM)
    try:
        operator.wait(timeout=15)
    except subprocess.TimeoutExpired:
        operator.kill()
        operator.wait()


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
