"""Fixtures that run the FlowForge operator as a subprocess against the test cluster and a
fresh test database, so a test can SIGKILL it and start it again.

- ``kube_api`` (session): a ``kubernetes`` ApiClient on the test cluster.
- ``engine_crds`` (session): the checked-in WorkflowRun CRD created through the API.
- ``engine_namespace``: a fresh namespace (with its default ServiceAccount), deleted after.
- ``engine_store``: an open pool on the test's fresh, migrated database.
- ``operators``: a factory of ``OperatorProcess``; every process is stopped at the end.
- ``operator``: one operator, started and holding the lease.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from flowforge.domain.api import API_VERSION, GROUP, RUN_KIND, RUN_PLURAL, VERSION
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster
from flowforge.store.connection import Pool
from flowforge.store.lease import current_lease
from flowforge.store.pool import open_pool
from tests.support.waiting import wait_until, wait_until_blocking

OPERATOR_START_SECONDS = 60.0
FINISHED_PHASES = {"Succeeded", "Failed", "Cancelled"}


# the name tests/cluster/test_schedules.py imports (the others use tests.support.waiting)
wait_for = wait_until_blocking


@pytest.fixture(scope="session")
def kube_api(cluster: Cluster) -> Iterator[k8s.ApiClient]:
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(
        config_file=str(cluster.kubeconfig),  # type: ignore[no-untyped-call]
        client_configuration=configuration,
    )
    configuration.connection_pool_maxsize = 16
    api = k8s.ApiClient(configuration)
    yield api
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def engine_crds(kube_api: k8s.ApiClient) -> list[str]:
    extensions = k8s.ApiextensionsV1Api(kube_api)
    names = []
    # runs reach the engine through the API; most tests publish definitions to the store
    for path in sorted((repo_root() / "crds").glob("*.flowforge.io.yaml")):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        names.append(name)
        try:
            extensions.create_custom_resource_definition(body)
        except ApiException as error:
            if error.status != 409:
                raise
            existing = extensions.read_custom_resource_definition(name)
            body["metadata"]["resourceVersion"] = existing.metadata.resource_version
            extensions.replace_custom_resource_definition(name, body)
    for name in names:

        def established(crd_name: str = name) -> bool:
            crd = extensions.read_custom_resource_definition(crd_name)
            return any(
                c.type == "Established" and c.status == "True"
                for c in (crd.status.conditions or [])
            )

        wait_until_blocking(established, timeout=60, what=f"CRD {name} Established")
    return names


@pytest.fixture
def engine_namespace(
    kube_api: k8s.ApiClient, engine_crds: list[str], request: pytest.FixtureRequest
) -> Iterator[str]:
    slug = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:30].strip("-")
    yield from fresh_namespace(kube_api, f"e-{slug}-{uuid.uuid4().hex[:6]}")


def fresh_namespace(kube_api: k8s.ApiClient, name: str) -> Iterator[str]:
    """Create the namespace, wait for its default ServiceAccount, yield it, delete it."""
    core = k8s.CoreV1Api(kube_api)
    core.create_namespace({"metadata": {"name": name}})

    def has_default_service_account() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    wait_until_blocking(has_default_service_account, timeout=30, what="default ServiceAccount")
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


@pytest.fixture
async def engine_store(store_dsn: str) -> AsyncIterator[Pool]:
    pool = await open_pool(store_dsn, min_size=1, max_size=8)
    try:
        yield pool
    finally:
        await pool.close()


@dataclass
class OperatorProcess:
    """One operator process; ``kill`` sends SIGKILL, ``start`` starts it again."""

    dsn: str
    kubeconfig: Path
    namespace: str
    log_path: Path
    identity: str
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def settings_environment(self) -> dict[str, str]:
        """The operator's configuration (FLOWFORGE_*, quick timings for tests)."""
        return {
            "FLOWFORGE_DSN": self.dsn,
            "FLOWFORGE_NAMESPACES": self.namespace,
            "FLOWFORGE_KUBECONFIG": str(self.kubeconfig),
            "KUBECONFIG": str(self.kubeconfig),
            "FLOWFORGE_IDENTITY": self.identity,
            "FLOWFORGE_RECONCILE_INTERVAL": "2",
            "FLOWFORGE_LEASE_TTL": "4",
            "FLOWFORGE_LEASE_RENEW": "1",
            "FLOWFORGE_RETRY_FIRST_DELAY": "0.5",
            **self.extra_env,
        }

    def command(self) -> list[str]:
        return [sys.executable, "-m", "flowforge.operator"]

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("already running")
        environment = {**os.environ, **self.settings_environment()}
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n===== start #{self.starts} =====\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            self.command(),
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(repo_root()),
        )
        log.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


async def wait_for_leader(
    pool: Pool,
    identity: str,
    *,
    timeout: float = OPERATOR_START_SECONDS,
    process: OperatorProcess | None = None,
) -> int:
    """Wait until ``identity`` holds the lease; returns its epoch."""

    async def epoch() -> int | None:
        lease = await current_lease(pool)
        if lease is not None and lease.holder == identity:
            return lease.epoch
        if process is not None and not process.running:
            raise AssertionError(f"operator exited early:\n{process.log_tail()}")
        return None

    taken: int = await wait_until(
        epoch, what=f"{identity} to take the lease", timeout=timeout, interval=0.2, operator=process
    )
    return taken


@pytest.fixture
def operators(
    cluster: Cluster, store_dsn: str, engine_namespace: str, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    made: list[OperatorProcess] = []

    def make(
        *,
        identity: str | None = None,
        start: bool = True,
        env: dict[str, str] | None = None,
        dsn: str | None = None,
    ) -> OperatorProcess:
        name = identity or f"op-{len(made) + 1}"
        process = OperatorProcess(
            dsn=dsn or store_dsn,
            kubeconfig=cluster.kubeconfig,
            namespace=engine_namespace,
            identity=name,
            log_path=tmp_path / f"{name}.log",
            extra_env=dict(env or {}),
        )
        made.append(process)
        if start:
            process.start()
        return process

    yield make
    for process in made:
        process.stop()


@pytest.fixture
async def operator(
    operators: Callable[..., OperatorProcess], engine_store: Pool
) -> OperatorProcess:
    process = operators()
    await wait_for_leader(engine_store, process.identity, process=process)
    return process


class RunDriver:
    """What a test does to runs and observes of them, through the real API and store."""

    def __init__(self, *, api: k8s.ApiClient, namespace: str, pool: Pool) -> None:
        self.api = api
        self.namespace = namespace
        self.pool = pool
        self.custom = k8s.CustomObjectsApi(api)
        self.batch = k8s.BatchV1Api(api)
        self.core = k8s.CoreV1Api(api)

    async def publish(self, spec: dict[str, Any]) -> None:
        """Publish a definition to the store, as admission does on a WorkflowDefinition."""
        from flowforge.domain.validation import parse_definition
        from flowforge.store.definitions import publish_definition

        await publish_definition(
            self.pool, namespace=self.namespace, definition=parse_definition(spec)
        )

    def create_run(
        self,
        name: str,
        *,
        workflow: str,
        version: int = 1,
        parameters: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            RUN_PLURAL,
            {
                "apiVersion": API_VERSION,
                "kind": RUN_KIND,
                "metadata": {"name": name},
                "spec": {"workflow": workflow, "version": version, "parameters": parameters or {}},
            },
        )
        return body

    def run(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, RUN_PLURAL, name
        )
        return body

    def cancel(self, name: str) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            RUN_PLURAL,
            name,
            {"spec": {"cancel": True}},
        )

    def delete_run(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, RUN_PLURAL, name
        )

    def jobs(self, run: str | None = None) -> list[Any]:
        selector = "app.kubernetes.io/managed-by=flowforge"
        if run is not None:
            selector += f",flowforge.io/run={run}"
        items: list[Any] = self.batch.list_namespaced_job(
            self.namespace, label_selector=selector
        ).items
        return items

    def events(self, run: str) -> list[Any]:
        items: list[Any] = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={run}"
        ).items
        return items

    def pod_finished(self, job: Any) -> Any:
        """When the task container of the Job's Pod ended (whole seconds): the moment its
        success is known, about a second before the Job's ``completionTime``."""
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"batch.kubernetes.io/controller-uid={job.metadata.uid}"
        ).items
        ended = [
            status.state.terminated.finished_at
            for pod in pods
            for status in pod.status.container_statuses or []
            if status.name == "task" and status.state.terminated is not None
        ]
        assert ended, f"no Pod of Job {job.metadata.name} says its task container ended"
        return max(ended)

    def printer_row(self, name: str) -> dict[str, Any]:
        """The row ``kubectl get wfr NAME`` prints (the apiserver's Table rendering)."""
        method, url, headers, body, _ = self.api.param_serialize(
            "GET",
            f"/apis/{API_VERSION}/namespaces/{self.namespace}/{RUN_PLURAL}/{name}",
            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=body)
        response.read()
        import json

        table = json.loads(response.data)
        columns = [column["name"] for column in table["columnDefinitions"]]
        return dict(zip(columns, table["rows"][0]["cells"], strict=True))

    async def wait_phase(
        self,
        name: str,
        phases: set[str],
        *,
        timeout: float = 90,
        operator: OperatorProcess | None = None,
    ) -> dict[str, Any]:
        return await wait_for_phase(
            lambda: self.run(name), run=name, phases=phases, timeout=timeout, operator=operator
        )

    async def wait_finished(self, names: Sequence[str], *, timeout: float) -> dict[str, str]:
        """Each run's phase, once every one of them has finished."""
        phases: dict[str, str] = {}

        def finished() -> dict[str, str] | None:
            phases.update({n: (self.run(n).get("status") or {}).get("phase", "") for n in names})
            return dict(phases) if set(phases.values()) <= FINISHED_PHASES else None

        found: dict[str, str] = await wait_until(
            finished, timeout=timeout, interval=0.5, what=lambda: f"every run finished: {phases}"
        )
        return found


async def wait_for_phase(
    read: Callable[[], dict[str, Any]],
    *,
    run: str,
    phases: set[str],
    timeout: float,
    operator: OperatorProcess | None = None,
) -> dict[str, Any]:
    """The WorkflowRun ``read`` returns, once its phase is one of ``phases``."""
    body: dict[str, Any] = {}

    def reached() -> dict[str, Any] | None:
        nonlocal body
        body = read()
        return body if (body.get("status") or {}).get("phase") in phases else None

    found: dict[str, Any] = await wait_until(
        reached,
        timeout=timeout,
        interval=0.25,
        what=lambda: f"run {run} in {phases}, its status: {body.get('status')}",
        operator=operator,
    )
    return found


@pytest.fixture
def driver(kube_api: k8s.ApiClient, engine_namespace: str, engine_store: Pool) -> RunDriver:
    return RunDriver(api=kube_api, namespace=engine_namespace, pool=engine_store)


class JobCreationLog:
    """Watches the namespace's Jobs from a thread and records every Job object created
    (name -> uids): a Job created twice under one name shows up as two uids."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        import threading

        self._batch = k8s.BatchV1Api(api)
        self._namespace = namespace
        self.uids_by_name: dict[str, set[str]] = {}
        self.labels_by_name: dict[str, dict[str, str]] = {}
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True)
        listing = self._batch.list_namespaced_job(namespace)
        self._version = listing.metadata.resource_version
        for job in listing.items:
            self._record(job)
        self._thread.start()

    def _record(self, job: Any) -> None:
        self.uids_by_name.setdefault(job.metadata.name, set()).add(job.metadata.uid)
        self.labels_by_name[job.metadata.name] = dict(job.metadata.labels or {})

    def _watch(self) -> None:
        try:
            self._follow()
        except BaseException as error:
            self.error = error

    def _follow(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self._batch.list_namespaced_job,
                    self._namespace,
                    resource_version=self._version,
                    timeout_seconds=5,
                    allow_watch_bookmarks=True,
                ):
                    job = event["object"]
                    if event["type"] == "BOOKMARK":
                        self._version = job["metadata"]["resourceVersion"]
                        continue
                    self._version = job.metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(job)
                    if self._stop.is_set():
                        break
            except ApiException as error:
                if error.status == 410:
                    raise AssertionError("Job watch expired: creations may be missed") from error
                raise

    async def caught_up(self, *, jobs: int, timeout: float = 30) -> None:
        """Wait until the watch has seen ``jobs`` Jobs (it lags behind the runs' status)."""
        await wait_until(
            lambda: len(self.labels_by_name) >= jobs,
            timeout=timeout,
            what=lambda: f"the Jobs' watch to see {jobs} Jobs: {len(self.labels_by_name)}",
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.error is not None:
            raise AssertionError(f"the Job watch failed: {self.error!r}") from self.error
