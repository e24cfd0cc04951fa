"""Benchmark: admission latency of WorkflowDefinitions of 10, 1,000 and 10,000 tasks.

Starts (or reuses, with --cluster-dir) the local control plane, a PostgreSQL server, the
webhook server (`python -m flowforge.admission.server`) and its webhook
configurations, then times for each size, over --rounds rounds after one warm-up:

* `kubectl apply --server-side --dry-run=server -f FILE`: what a user waits for, including
  kubectl's own start-up (server-side apply, because a 10,000-task document does not fit
  client-side apply's last-applied annotation, limited to 256 KiB);
* the same create with `dryRun=All` from the Python client: apiserver plus webhook;
* the same create with the webhook configurations removed: the apiserver alone;
* the AdmissionReview POSTed straight to the webhook server: the webhook alone; and again with
  a template it has not seen before each time (so the dry-runs' answers are not cached);
* hostile bodies POSTed straight to the server (megabytes of unterminated escapes, random
  bytes, deep nesting), each followed by a real review that must still be admitted.

Prints p50 and p99 (nearest rank) in milliseconds, and the webhook server's CPU time per
review (from /proc: less swayed by a busy machine than the wall-clock figures). No target is
asserted.
Run: ``.venv/bin/python bench/bench_admission.py [--rounds 20] [--cluster-dir DIR]``.
With ``FLOWFORGE_BENCH_PROFILE=DIR`` py-spy samples the webhook server (100 Hz, raw collapsed
stacks, one file per path and size: ``webhook-direct-1000.txt``, ``webhook-apiserver-1000.txt``)
into DIR; the figures of such a run include py-spy's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import math
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from kubernetes import client, config

from flowforge.admission.certs import (
    ClientCertificates,
    WebhookCertificates,
    generate_webhook_certificates,
)
from flowforge.domain.api import DEFINITION_PLURAL, GROUP, VERSION
from flowforge.kube.webhook_config import (
    VALIDATE_DEFINITION_HANDLER_ID,
    apply_webhook_configurations,
    delete_webhook_configurations,
    local_endpoint,
)
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, kubectl, start_cluster, stop_cluster
from flowforge.store.migrate import migrate
from harness.cluster import local_postgres
from harness.processes import cpu_seconds

SIZES = (10, 1_000, 10_000)
NAMESPACE = "default"
PROFILE_DIR = os.environ.get("FLOWFORGE_BENCH_PROFILE", "")


def definition(tasks: int, *, seed: int = 11, image: str = "busybox:1.36") -> dict[str, Any]:
    """A valid DAG: each task depends on up to three of the 20 declared before it."""
    rng = random.Random(seed)
    keys = [f"task-{index:05d}" for index in range(tasks)]
    documents: list[dict[str, Any]] = []
    for index, key in enumerate(keys):
        document: dict[str, Any] = {"key": key, "type": "step", "config": {"index": index}}
        window = keys[max(0, index - 20) : index]
        if window:
            document["dependsOn"] = sorted(rng.sample(window, min(len(window), 3)))
        documents.append(document)
    return {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowDefinition",
        "metadata": {"name": f"bench-{tasks}", "namespace": NAMESPACE},
        "spec": {
            "workflow": f"bench-{tasks}",
            "version": 1,
            "taskTypes": {"step": {"image": image}},
            "tasks": documents,
        },
    }


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def timed(rounds: int, action: Callable[[], None]) -> list[float]:
    action()  # warm-up: connections, caches, kopf's first handler call
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


@contextlib.contextmanager
def profiled(pid: int, label: str) -> Iterator[None]:
    """``FLOWFORGE_BENCH_PROFILE=DIR``: py-spy samples process ``pid`` while the block runs
    and writes its collapsed stacks to DIR/webhook-LABEL.txt (see the module's doc)."""
    if not PROFILE_DIR:
        yield
        return
    output = Path(PROFILE_DIR) / f"webhook-{label}.txt"
    output.parent.mkdir(parents=True, exist_ok=True)
    py_spy = Path(sys.executable).parent / "py-spy"
    command = [str(py_spy), "record", "--nonblocking", "-r", "100", "-f", "raw"]
    sampler = subprocess.Popen(
        [*command, "-o", str(output), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches before the first sample is wanted
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
        sampler.wait(timeout=30)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post_raw(
    certs: WebhookCertificates, client: ClientCertificates, port: int, body: bytes
) -> tuple[int, bytes]:
    """POST as the apiserver does: trusting the serving CA, presenting its client certificate."""
    context = ssl.create_default_context(cafile=str(certs.ca_cert_path))
    context.load_cert_chain(client.cert_path, client.key_path)
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        connection.request("POST", f"/{VALIDATE_DEFINITION_HANDLER_ID}", body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def post_review(
    certs: WebhookCertificates, client: ClientCertificates, port: int, body: bytes
) -> dict[str, Any]:
    status, payload = post_raw(certs, client, port, body)
    if status != 200:
        raise RuntimeError(f"webhook answered {status}: {payload[:300]!r}")
    result: dict[str, Any] = json.loads(payload)["response"]
    return result


# Just under the server's 8 MiB body limit, so that each is read and looked at.
_HOSTILE_SIZE = 8 * 1024 * 1024 - 64
HOSTILE_BODIES: dict[str, Callable[[], bytes]] = {
    "64 KiB unterminated escapes": lambda: b'{"request":{"uid":"' + b'\\"' * (32 * 1024),
    "8 MiB unterminated escapes": lambda: b'{"request":{"uid":"' + b'\\"' * (_HOSTILE_SIZE // 2),
    "8 MiB random bytes": lambda: random.Random(5).randbytes(_HOSTILE_SIZE),
    "8 MiB of '['": lambda: b"[" * _HOSTILE_SIZE,
    "8 MiB of '{\"a\":'": lambda: b'{"a":' * (_HOSTILE_SIZE // 5),
    "200,000 levels in a task config": lambda: admission_review(definition(1)).replace(
        b'{"index": 0}', b'{"n":[' * 100_000 + b"1" + b"]}" * 100_000
    ),
}


def time_hostile_bodies(
    rounds: int, *, certs: WebhookCertificates, client: ClientCertificates, port: int
) -> list[tuple[str, int, list[float]]]:
    """Each body answered (a 400 or a denial), then a real review still admitted."""
    results = []
    valid = admission_review(definition(10))
    for label, make in HOSTILE_BODIES.items():
        body = make()

        def hostile(body: bytes = body, label: str = label) -> None:
            status, payload = post_raw(certs, client, port, body)
            if status == 200 and json.loads(payload)["response"]["allowed"]:
                raise RuntimeError(f"{label}: admitted")

        results.append((label, len(body), timed(rounds, hostile)))
        answer = post_review(certs, client, port, valid)
        if not answer["allowed"]:
            message = (answer.get("status") or {}).get("message")
            raise RuntimeError(f"after {label}: a valid definition was denied: {message}")
    return results


def admission_review(obj: dict[str, Any]) -> bytes:
    resource = {"group": GROUP, "version": VERSION, "resource": DEFINITION_PLURAL}
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": GROUP, "version": VERSION, "kind": obj["kind"]},
                "resource": resource,
                "namespace": NAMESPACE,
                "operation": "CREATE",
                "userInfo": {"username": "bench"},
                "object": obj,
                "dryRun": True,
            },
        }
    ).encode()


@contextlib.contextmanager
def local_cluster(cluster_dir: Path | None, scratch: Path) -> Iterator[Cluster]:
    state_dir = cluster_dir or scratch / "cluster"
    try:
        cluster = start_cluster(state_dir=state_dir)
        crds = repo_root() / "crds"
        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(crds))
        kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        # the author of the reviews posted straight to the webhook: the webhook asks the
        # apiserver whether they may create the definition (before anything is read for
        # them) and the Jobs it would make
        kubectl(
            cluster,
            "create",
            "clusterrole",
            "flowforge-publish",
            "--verb=create",
            "--resource=workflowdefinitions.flowforge.io",
        )
        for role in ("edit", "flowforge-publish"):
            kubectl(
                cluster,
                "create",
                "rolebinding",
                f"bench-{role}",
                f"--clusterrole={role}",
                "--user=bench",
                "--namespace",
                NAMESPACE,
            )
        yield cluster
    finally:
        if cluster_dir is None:
            stop_cluster(state_dir)


@contextlib.contextmanager
def local_store() -> Iterator[str]:
    with local_postgres(settings={"fsync": "off"}) as server_dsn:
        with psycopg.connect(server_dsn, autocommit=True) as connection:
            connection.execute("CREATE DATABASE flowforge_bench")
        dsn = psycopg.conninfo.make_conninfo(server_dsn, dbname="flowforge_bench")
        asyncio.run(migrate(dsn))
        yield dsn


@contextlib.contextmanager
def webhook_server(
    cluster: Cluster, dsn: str, scratch: Path
) -> Iterator[tuple[WebhookCertificates, int, int]]:
    certs = generate_webhook_certificates(scratch / "certs")
    port = free_port()
    log_path = scratch / "webhook-server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowforge.admission.server",
                *("--port", str(port), "--certs", str(scratch / "certs")),
                *("--client-ca", str(cluster.webhook_client.ca_cert_path)),
                *("--dsn", dsn, "--kubeconfig", str(cluster.kubeconfig)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"webhook server exited:\n{log_path.read_text()[-3000:]}")
            try:
                post_review(certs, cluster.webhook_client, port, b"probe")
            except RuntimeError:
                break  # a 400 for the probe: it serves
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield certs, port, process.pid
    finally:
        process.terminate()
        process.wait(timeout=15)


def wait_until_enforced(cluster: Cluster) -> None:
    cyclic = definition(2)
    cyclic["spec"]["tasks"][0]["dependsOn"] = ["task-00001"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result = kubectl(
            cluster, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(cyclic), check=False
        )
        if "dependency cycle" in result.stderr:
            return
        time.sleep(0.3)
    raise RuntimeError("the apiserver never called the webhook")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--cluster-dir", type=Path, help="reuse a running local control plane")
    parser.add_argument(
        "--hostile-only", action="store_true", help="only the hostile bodies, not the sizes"
    )
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="flowforge-bench-admission-"))
    results: list[tuple[str, int, list[float]]] = []
    hostile: list[tuple[str, int, list[float]]] = []
    cpu_per_review: dict[int, float] = {}
    try:
        with (
            local_cluster(args.cluster_dir, scratch) as cluster,
            local_store() as dsn,
            webhook_server(cluster, dsn, scratch) as (certs, port, pid),
        ):
            hostile = time_hostile_bodies(
                args.rounds, certs=certs, client=cluster.webhook_client, port=port
            )
            if args.hostile_only:
                return
            manifests: dict[int, Path] = {}
            for size in SIZES:
                manifests[size] = scratch / f"definition-{size}.json"
                manifests[size].write_text(json.dumps(definition(size)))
            api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(cluster.kubeconfig)
            )
            custom: Any = client.CustomObjectsApi(api_client)

            def create_dry_run(size: int) -> Callable[[], None]:
                body = definition(size)

                def create() -> None:
                    custom.create_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        NAMESPACE,
                        DEFINITION_PLURAL,
                        body,
                        dry_run="All",
                    )

                return create

            for size in SIZES:
                results.append(
                    (
                        "apiserver without webhook (client, dryRun=All)",
                        size,
                        timed(args.rounds, create_dry_run(size)),
                    )
                )
            apply_webhook_configurations(
                local_endpoint(port=port, ca_pem=certs.ca_pem), kubeconfig=cluster.kubeconfig
            )
            try:
                wait_until_enforced(cluster)
                for size in SIZES:
                    review = admission_review(definition(size))

                    def direct(review: bytes = review) -> None:
                        if not post_review(certs, cluster.webhook_client, port, review)["allowed"]:
                            raise RuntimeError("a valid definition was denied")

                    def through_kubectl(path: Path = manifests[size]) -> None:
                        kubectl(
                            cluster, "apply", "--server-side", "--dry-run=server", "-f", str(path)
                        )

                    with profiled(pid, f"direct-{size}"):
                        cpu = cpu_seconds(pid)
                        alone = timed(args.rounds, direct)
                        cpu = cpu_seconds(pid) - cpu
                    results.append(("webhook alone (HTTPS POST)", size, alone))
                    cpu_per_review[size] = cpu * 1000 / (args.rounds + 1)
                    # a template never seen before, each time: its dry-runs are not cached
                    fresh = iter(
                        [
                            admission_review(definition(size, image=f"busybox:1.36.{index}"))
                            for index in range(args.rounds + 1)
                        ]
                    )

                    def direct_fresh(fresh: Iterator[bytes] = fresh) -> None:
                        direct(next(fresh))

                    results.append(
                        (
                            "webhook alone, a new template each time",
                            size,
                            timed(args.rounds, direct_fresh),
                        )
                    )
                    with profiled(pid, f"apiserver-{size}"):
                        both = timed(args.rounds, create_dry_run(size))
                    results.append(("apiserver + webhook (client, dryRun=All)", size, both))
                    results.append(
                        (
                            "kubectl apply --server-side --dry-run=server",
                            size,
                            timed(args.rounds, through_kubectl),
                        )
                    )
            finally:
                delete_webhook_configurations(kubeconfig=cluster.kubeconfig)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        report(args.rounds, results=results, hostile=hostile, cpu_per_review=cpu_per_review)


def report(
    rounds: int,
    *,
    results: list[tuple[str, int, list[float]]],
    hostile: list[tuple[str, int, list[float]]],
    cpu_per_review: dict[int, float],
) -> None:
    if hostile:
        print(f"hostile bodies posted to the webhook, {rounds} rounds after one warm-up (ms)")
        print(f"{'body':<36} {'bytes':>9} {'p50':>9} {'p99':>9}")
        for label, size, samples in hostile:
            print(
                f"{label:<36} {size:>9} {percentile(samples, 0.50):>9.1f} "
                f"{percentile(samples, 0.99):>9.1f}"
            )
    if not results:
        return
    print(f"admission latency, {rounds} rounds after one warm-up (milliseconds)")
    print(f"{'path':<50} {'tasks':>6} {'p50':>9} {'p99':>9}")
    for label, size, samples in results:
        print(
            f"{label:<50} {size:>6} {percentile(samples, 0.50):>9.1f} "
            f"{percentile(samples, 0.99):>9.1f}"
        )
    for size, milliseconds in cpu_per_review.items():
        print(f"webhook server CPU per review (posted straight to it), {size} tasks: ", end="")
        print(f"{milliseconds:.1f} ms")


if __name__ == "__main__":
    main()
