"""A saga run's trace, end to end: the operator sends it over OTLP/HTTP to a real Jaeger
(all-in-one, built from the Go module proxy by `make jaeger`) on 127.0.0.1, and Jaeger's HTTP
API gives back one trace under the creator's span, with the times the store recorded."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flowforge.domain.api import API_VERSION, GROUP, RUN_KIND, RUN_PLURAL, VERSION
from flowforge.domain.tracing import TRACEPARENT_ANNOTATION, span_id
from flowforge.localdev.binaries import repo_root
from flowforge.store.events import run_history
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.support.waiting import wait_until, wait_until_blocking

pytestmark = pytest.mark.cluster

BUILD_SCRIPT = repo_root() / "deploy" / "tools" / "build-jaeger.sh"
OK = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
FAIL = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-exit-code": "3"}}
SAGA: dict[str, Any] = {
    "workflow": "order",
    "version": 1,
    "taskTypes": {"ok": OK, "fail": FAIL},
    "tasks": [
        {"key": "reserve", "type": "ok"},
        {"key": "charge", "type": "ok", "dependsOn": ["reserve"]},
        {"key": "ship", "type": "fail", "dependsOn": ["charge"]},
        {"key": "release", "type": "ok", "compensateFor": "reserve"},
        {"key": "refund", "type": "ok", "compensateFor": "charge"},
    ],
}
CREATOR_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CREATOR_SPAN = "00f067aa0ba902b7"


def _jaeger_binary() -> Path:
    version = re.search(r"^JAEGER_VERSION=(\S+)$", BUILD_SCRIPT.read_text(), re.MULTILINE)
    assert version is not None
    cache = Path(os.environ.get("FLOWFORGE_CACHE") or Path.home() / ".cache" / "flowforge")
    binary = cache / "jaeger" / version[1] / "jaeger"
    assert binary.is_file(), f"{binary} is missing: run `make jaeger` (a prerequisite of make test)"
    return binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class Jaeger:
    def __init__(self, *, otlp_port: int, query_port: int) -> None:
        self.otlp = f"http://127.0.0.1:{otlp_port}"
        self.query = f"http://127.0.0.1:{query_port}"

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        try:
            data = _get(f"{self.query}/api/traces/{trace_id}").get("data") or []
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise
        return data[0] if data else None


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    binary = _jaeger_binary()
    otlp, query, grpc = _free_port(), _free_port(), _free_port()
    directory = tmp_path_factory.mktemp("jaeger")
    config = directory / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "service": {
                    "extensions": ["jaeger_storage", "jaeger_query"],
                    "pipelines": {
                        "traces": {"receivers": ["otlp"], "exporters": ["jaeger_storage_exporter"]}
                    },
                    "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
                },
                "extensions": {
                    "jaeger_storage": {"backends": {"mem": {"memory": {"max_traces": 1000}}}},
                    "jaeger_query": {
                        "storage": {"traces": "mem"},
                        "http": {"endpoint": f"127.0.0.1:{query}"},
                        "grpc": {"endpoint": f"127.0.0.1:{grpc}"},
                    },
                },
                "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{otlp}"}}}},
                "exporters": {"jaeger_storage_exporter": {"trace_storage": "mem"}},
            }
        )
    )
    log = (directory / "jaeger.log").open("wb")
    process = subprocess.Popen(
        [str(binary), f"--config={config}"], stdout=log, stderr=subprocess.STDOUT
    )
    server = Jaeger(otlp_port=otlp, query_port=query)
    try:

        def answers() -> bool:
            try:
                _get(f"{server.query}/api/services")
            except (OSError, ValueError):
                assert process.poll() is None, (directory / "jaeger.log").read_text()
                return False
            return True

        wait_until_blocking(answers, timeout=60, what="Jaeger to answer")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _micros(at: Any) -> int:
    return int(at.timestamp() * 1_000_000)


async def test_a_saga_runs_trace_reaches_jaeger_under_its_creators_span(
    jaeger: Jaeger,
    operators: Callable[..., OperatorProcess],
    engine_store: Any,
    driver: RunDriver,
) -> None:
    operator = operators(
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp,
            "OTEL_SERVICE_NAME": f"flowforge-{driver.namespace}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
    )
    await wait_for_leader(engine_store, operator.identity, process=operator)
    await driver.publish(SAGA)
    traceparent = f"00-{CREATOR_TRACE}-{CREATOR_SPAN}-01"
    body = driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        RUN_PLURAL,
        {
            "apiVersion": API_VERSION,
            "kind": RUN_KIND,
            "metadata": {"name": "o1", "annotations": {TRACEPARENT_ANNOTATION: traceparent}},
            "spec": {"workflow": "order", "version": 1},
        },
    )
    uid = str(body["metadata"]["uid"])
    await driver.wait_phase("o1", {"Failed"}, timeout=120, operator=operator)

    # each Job names its attempt's span
    ship = next(
        job for job in driver.jobs("o1") if job.metadata.labels["flowforge.io/task"] == "ship"
    )
    env = {entry.name: entry.value for entry in ship.spec.template.spec.containers[0].env}
    assert env["TRACEPARENT"] == f"00-{CREATOR_TRACE}-{span_id(uid, 'task', 'ship', '1')}-01"

    trace = await wait_until(
        lambda: (found := jaeger.trace(CREATOR_TRACE)) and len(found["spans"]) >= 12 and found,
        timeout=30,
        what="the run's 12 spans in Jaeger",
        operator=operator,
    )
    spans = {span["operationName"]: span for span in trace["spans"]}
    assert len(trace["spans"]) == len(spans) == 12, sorted(spans)
    by_id = {span["spanID"]: span for span in trace["spans"]}

    def parent(name: str) -> str:
        references = [r for r in spans[name]["references"] if r["refType"] == "CHILD_OF"]
        assert len(references) == 1, spans[name]["references"]
        assert references[0]["traceID"] == CREATOR_TRACE
        return str(references[0]["spanID"])

    assert parent("RUN order") == CREATOR_SPAN  # under the creator's span
    run_id = spans["RUN order"]["spanID"]
    for task in ("reserve", "charge", "ship"):
        assert parent(task) == run_id
        assert by_id[parent(f"{task} attempt 1")]["operationName"] == task
    assert parent("rollback") == run_id
    for step in ("refund", "release"):
        assert parent(f"compensate {step}") == spans["rollback"]["spanID"]
        assert by_id[parent(f"{step} attempt 1")]["operationName"] == f"compensate {step}"
    assert spans["ship attempt 1"]["spanID"] == span_id(uid, "task", "ship", "1")
    # the rollback in order: refund (undoing charge) before release (undoing reserve)
    refund, release = spans["compensate refund"], spans["compensate release"]
    assert refund["startTime"] + refund["duration"] <= release["startTime"]

    # the times are the store's
    run = await find_run(engine_store, namespace=driver.namespace, name="o1", uid=uid)
    events = await run_history(engine_store, run.id)
    recorded = {(e.kind, e.task_key): _micros(e.recorded_at) for e in events}
    assert spans["RUN order"]["startTime"] == recorded[("run.created", None)]
    end = spans["RUN order"]["startTime"] + spans["RUN order"]["duration"]
    assert end == recorded[("run.failed", None)]
    assert spans["rollback"]["startTime"] == recorded[("run.compensating", None)]
    charge = spans["charge attempt 1"]
    assert charge["startTime"] + charge["duration"] == recorded[("task.succeeded", "charge")]
    assert spans["refund attempt 1"]["startTime"] == recorded[("compensation.started", "refund")]
    tags = {tag["key"]: tag["value"] for tag in spans["RUN order"]["tags"]}
    assert tags["cicd.pipeline.name"] == "order"
    assert tags["cicd.pipeline.run.id"] == uid
    assert tags["cicd.pipeline.result"] == "failure"
