"""The container image, built here and run: `make image` (deploy/image/build.sh: buildah on a
Debian base made with mmdebstrap when no registry base can be pulled) builds the Dockerfile,
and the commands, environment and user the Helm chart gives its containers run from that
image (`buildah run --isolation chroot --network host`) against the local control plane and a
test PostgreSQL: the migration, the admission webhooks (registered with the apiserver, so
`kubectl apply` goes through them) and the operator complete the saga example."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from kubernetes import client as k8s
from psycopg import sql

from flowforge.admission.certs import WebhookCertificates
from flowforge.domain.api import REQUESTED_BY_ANNOTATION
from flowforge.kube.webhook_config import (
    apply_webhook_configurations,
    delete_webhook_configurations,
    local_endpoint,
)
from flowforge.localdev import postgres as localdev_postgres
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.pool import open_pool
from tests.plugins.helm import Helm
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.plugins.webhooks import (
    _free_port,
    _wait_until_enforced,
    spawn_webhook_server,
    stop_webhook_server,
)
from tests.support.ports import free_port
from tests.support.sagas import (
    REFUND_THEN_RELEASE,
    compensation_history,
    compensation_jobs,
    steps,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

ROOT = repo_root()
BUILDAH = ROOT / "deploy" / "image" / "buildah.sh"
SAGA = ROOT / "examples" / "saga-order.yaml"
# Where the chart mounts what the test mounts; the kubeconfig stands in for the pod's
# service account.
KUBECONFIG_IN_IMAGE = "/etc/flowforge/kube/config"
STOP_SECONDS = 20.0


def buildah(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        ["bash", str(BUILDAH), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def make_image() -> str:
    """`make image`; returns the image's name."""
    built = subprocess.run(
        ["bash", str(ROOT / "deploy" / "image" / "build.sh")],
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert built.returncode == 0, f"make image failed:\n{built.stdout}\n{built.stderr}"
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def image() -> str:
    """Built before pytest by `make test`: then every layer is reused; else it builds."""
    return make_image()


@dataclass(frozen=True)
class ChartContainers:
    """What the chart's templates run: image, commands, plain env values, user, mounts."""

    image: str
    user: str
    operator: dict[str, Any]
    migrate: dict[str, Any]
    webhook: dict[str, Any]
    volumes: dict[str, dict[str, Any]]


def render_chart(cluster: Cluster, *, client_ca: Path, home: Path) -> ChartContainers:
    helm = Helm(cluster.bin_dir / "helm", home)
    manifests = helm.template({"webhook": {"clientAuth": {"caCert": client_ca.read_text()}}})
    deployments = {
        doc["metadata"]["labels"]["app.kubernetes.io/component"]: doc["spec"]["template"]["spec"]
        for doc in manifests
        if doc["kind"] == "Deployment"
    }
    operator_pod, webhook_pod = deployments["operator"], deployments["webhook"]
    (operator,) = operator_pod["containers"]
    (webhook,) = webhook_pod["containers"]
    (migrate,) = operator_pod["initContainers"]
    assert operator["image"] == webhook["image"] == migrate["image"]
    pod_security = operator_pod["securityContext"]
    return ChartContainers(
        image=operator["image"],
        user=f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}",
        operator=operator,
        migrate=migrate,
        webhook=webhook,
        volumes={
            volume["name"]: volume for volume in operator_pod["volumes"] + webhook_pod["volumes"]
        },
    )


def plain_env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


def mount_paths(chart: ChartContainers, container: dict[str, Any], kind: str) -> list[str]:
    return [
        mount["mountPath"]
        for mount in container.get("volumeMounts", [])
        if kind in chart.volumes[mount["name"]]
    ]


@dataclass
class Container:
    """A working container of the image (`buildah from`): what the chart runs, run in it as
    the image's own user, with the chart's emptyDirs as tmpfs and the rest read-only."""

    id: str
    tmpfs: list[str]
    mounts: dict[str, Path] = field(default_factory=dict)

    def run_command(self, command: list[str], env: dict[str, str]) -> list[str]:
        return [
            *("bash", str(BUILDAH), "run", "--isolation", "chroot", "--network", "host"),
            *(f"--mount=type=tmpfs,destination={path}" for path in self.tmpfs),
            *(f"--volume={source}:{target}:ro" for target, source in self.mounts.items()),
            *(f"--env={name}={value}" for name, value in sorted(env.items())),
            self.id,
            "--",
            *command,
        ]

    def written_files(self) -> list[str]:
        """Files the runs left in the container's own layer (mount points are directories)."""
        upper = Path(buildah("mount", self.id)).parent / "diff"
        return sorted(
            str(path.relative_to(upper)) for path in upper.rglob("*") if not path.is_dir()
        )


def stop_gracefully(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM the program itself (buildah run would SIGKILL it), as the kubelet does."""
    inner = innermost_child(process.pid)
    os.kill(inner, signal.SIGTERM)
    try:
        return process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
        raise AssertionError(f"pid {inner} ignored SIGTERM for {STOP_SECONDS:.0f} s") from None


def innermost_child(pid: int) -> int:
    while True:
        children = [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
        if not children:
            return pid
        pid = children[-1]


def handles_sigterm(pid: int) -> bool:
    caught = next(
        line.split()[1]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("SigCgt:")
    )
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


@dataclass
class ImageOperator(OperatorProcess):
    """The operator fixture's process, run from the image with the chart's command."""

    container: Container | None = None
    chart_command: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        assert self.container is not None
        return self.container.run_command(self.chart_command, self.settings_environment())


@pytest.fixture
def containers(image: str) -> Iterator[list[Container]]:
    made: list[Container] = []
    yield made
    for container in made:
        buildah("rm", container.id)


@pytest.fixture
def image_database(postgres_server_dsn: str) -> Iterator[dict[str, str]]:
    """A database of its own with a login per component, as `make dev` provisions it."""
    name = f"flowforge_image_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsns = localdev_postgres.provision(postgres_server_dsn, database=name)
    yield dsns
    with psycopg.connect(postgres_server_dsn, autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def mounted_files(directory: Path, files: dict[str, bytes], *, user: str) -> Path:
    """A folder owned by the chart's uid and gid, readable by it only (like a pod's Secret
    volume with fsGroup)."""
    directory.mkdir(parents=True)
    uid, gid = (int(part) for part in user.split(":"))
    for name, content in files.items():
        path = directory / name
        path.write_bytes(content)
        path.chmod(0o600)
        os.chown(path, uid, gid)
    os.chown(directory, uid, gid)
    return directory


async def test_the_chart_commands_run_from_the_image_and_complete_the_saga(
    image: str,
    cluster: Cluster,
    flowforge_crds: list[str],
    engine_namespace: str,
    kube_api: k8s.ApiClient,
    image_database: dict[str, str],
    containers: list[Container],
    tmp_path: Path,
) -> None:
    chart = render_chart(
        cluster, client_ca=cluster.webhook_client.ca_cert_path, home=tmp_path / "helm"
    )
    # the chart pulls the image that `make image` builds, and runs it as the image's user
    assert image == f"localhost/{chart.image}", (image, chart.image)
    config = yaml.safe_load(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
    assert config["User"] == chart.user

    def container(spec: dict[str, Any]) -> Container:
        made = Container(
            id=buildah("from", "--pull=never", "--quiet", image),
            tmpfs=mount_paths(chart, spec, "emptyDir"),
        )
        containers.append(made)
        return made

    kube = mounted_files(
        tmp_path / "kube",
        {"config": kubectl(cluster, "config", "view", "--flatten", "--minify").stdout.encode()},
        user=chart.user,
    )

    # 1. the migration, as the chart's init container runs it
    migrate = container(chart.migrate)
    done = subprocess.run(
        migrate.run_command(
            chart.migrate["command"], {"FLOWFORGE_DSN": image_database["migrator"]}
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    # 2. the admission webhooks, with the chart's TLS and client-CA mounts
    webhook = container(chart.webhook)
    (tls_path,) = mount_paths(chart, chart.webhook, "secret")
    (client_ca_path,) = mount_paths(chart, chart.webhook, "configMap")

    def webhook_command(port: int, certs: WebhookCertificates) -> list[str]:
        webhook.mounts = {
            tls_path: mounted_files(
                tmp_path / "tls",
                {
                    path.name: path.read_bytes()
                    for path in (certs.ca_cert_path, certs.cert_path, certs.key_path)
                },
                user=chart.user,
            ),
            client_ca_path: mounted_files(
                tmp_path / "client-ca",
                {"ca.crt": cluster.webhook_client.ca_cert_path.read_bytes()},
                user=chart.user,
            ),
            str(Path(KUBECONFIG_IN_IMAGE).parent): kube,
        }
        # the chart's command; the addresses narrowed to loopback (the last flag wins)
        return webhook.run_command(
            [
                *chart.webhook["command"],
                "--addr=127.0.0.1",
                f"--port={port}",
                "--probe-addr=127.0.0.1",  # the chart's $(POD_IP), which no kubelet sets here
                f"--probe-port={free_port()}",
                f"--kubeconfig={KUBECONFIG_IN_IMAGE}",
            ],
            {**plain_env(chart.webhook), "FLOWFORGE_DSN": image_database["webhook"]},
        )

    server = spawn_webhook_server(
        cluster,
        directory=tmp_path / "webhook",
        dsn=image_database["webhook"],
        command=webhook_command,
    )
    operator: ImageOperator | None = None
    store = await open_pool(image_database["migrator"], min_size=1, max_size=2, name="image-test")
    try:
        apply_webhook_configurations(
            local_endpoint(port=server.port, ca_pem=server.certs.ca_pem),
            kubeconfig=cluster.kubeconfig,
        )
        _wait_until_enforced(cluster, server)

        # 3. the operator, with the chart's environment (quick timings for the test)
        health_port, metrics_port = _free_port(), _free_port()
        operator_container = container(chart.operator)
        operator_container.mounts = {str(Path(KUBECONFIG_IN_IMAGE).parent): kube}
        operator = ImageOperator(
            dsn=image_database["operator"],
            kubeconfig=Path(KUBECONFIG_IN_IMAGE),
            namespace=engine_namespace,
            log_path=tmp_path / "operator.log",
            identity="image-operator",
            extra_env={
                **plain_env(chart.operator),
                "FLOWFORGE_RECONCILE_INTERVAL": "2",
                "FLOWFORGE_JOB_TTL": "-1",
                "FLOWFORGE_METRICS_HOST": "127.0.0.1",
                "FLOWFORGE_METRICS_PORT": str(metrics_port),
                "FLOWFORGE_HEALTH_PORT": str(health_port),
            },
            container=operator_container,
            chart_command=chart.operator["command"],
        )
        operator.start()
        await wait_for_leader(store, operator.identity, process=operator)

        # 4. the saga example, through the apiserver and the image's webhooks
        applied = kubectl(cluster, "apply", "-n", engine_namespace, "-f", str(SAGA))
        assert "workflowrun.flowforge.io/order-1001 created" in applied.stdout, applied.stdout
        driver = RunDriver(api=kube_api, namespace=engine_namespace, pool=store)
        body = await driver.wait_phase("order-1001", {"Succeeded", "Failed"}, operator=operator)
        assert body["status"]["phase"] == "Failed", body["status"]
        assert REQUESTED_BY_ANNOTATION in body["metadata"]["annotations"], "mutating webhook"
        assert steps(body) == [
            ("refund", "charge", "succeeded"),
            ("release", "reserve", "succeeded"),
        ]
        refund, release = compensation_jobs(driver, "order-1001")
        assert [job.metadata.labels["flowforge.io/task"] for job in (refund, release)] == [
            "refund",
            "release",
        ]
        # one at a time: release's Job follows refund's Pod success (its Job completes later)
        assert release.metadata.creation_timestamp >= driver.pod_finished(refund)
        assert await compensation_history(driver, "order-1001") == REFUND_THEN_RELEASE

        # both handle SIGTERM themselves, so as a pod's PID 1 they stop on the kubelet's
        assert operator.process is not None
        for process in (server.process, operator.process):
            assert handles_sigterm(innermost_child(process.pid)), process.args
        assert stop_gracefully(operator.process) == 0, operator.log_tail()
        assert stop_gracefully(server.process) == 0, server.log_tail()
    finally:
        if operator is not None and operator.running:
            operator.kill()
        if server.process.poll() is None:
            stop_webhook_server(server)
        delete_webhook_configurations(kubeconfig=cluster.kubeconfig)
        await store.close()

    # read-only root filesystem: nothing was written outside the chart's emptyDirs
    for made in containers:
        assert made.written_files() == [], made.id


def test_make_image_again_reuses_every_layer(image: str) -> None:
    before = buildah("images", "--format", "{{.ID}}", image)
    assert make_image() == image
    # a step that ran again would have made a new image (its layer has new timestamps)
    assert buildah("images", "--format", "{{.ID}}", image) == before
