"""The engine sends a run's trace when it becomes final, built from the real store's rows,
and each Job it creates carries its attempt's TRACEPARENT (fake Kubernetes, real PostgreSQL,
an in-memory span exporter)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flowforge.domain.states import RunPhase, TaskRole
from flowforge.domain.tracing import TRACEPARENT_ANNOTATION, attempt_traceparent
from flowforge.operator import tracing
from flowforge.store.events import run_history
from tests.engine.conftest import Harness
from tests.support.workflows import SAGA

pytestmark = pytest.mark.store

CREATOR = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    sender = tracing.SpanSender(memory, service_name="flowforge-engine-test")
    monkeypatch.setattr(tracing, "_tracer", tracing.RunTracer(sender))
    yield memory
    sender.shutdown()


async def test_a_finished_saga_sends_its_trace_from_the_stores_rows(
    harness: Harness, exporter: InMemorySpanExporter
) -> None:
    body = await harness.unstarted("saga", SAGA)
    body["metadata"]["annotations"] = {TRACEPARENT_ANNOTATION: CREATOR}
    await harness.engine.start_run(body)
    uid = str(body["metadata"]["uid"])
    await harness.finish("reserve")
    await harness.finish("charge")
    await harness.finish("ship", succeeded=False)
    await harness.finish("refund")
    await harness.finish("release")
    tracer = tracing._tracer
    assert tracer is not None
    await tracer.drain()

    for job in harness.kube.jobs.values():
        labels = job["metadata"]["labels"]
        env = {
            e["name"]: e.get("value")
            for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["TRACEPARENT"] == attempt_traceparent(
            uid=uid,
            traceparent=CREATOR,
            role=TaskRole(labels["flowforge.io/role"]),
            task_key=labels["flowforge.io/task"],
            attempt=int(labels["flowforge.io/attempt"]),
        )
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert sorted(spans) == sorted(
        [
            "RUN saga",
            *(
                name
                for task in ("reserve", "charge", "ship")
                for name in (task, f"{task} attempt 1")
            ),
            "rollback",
            "compensate refund",
            "refund attempt 1",
            "compensate release",
            "release attempt 1",
        ]
    )
    run = spans["RUN saga"]
    assert run.context is not None and run.parent is not None
    assert f"{run.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert f"{run.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert run.attributes is not None and run.attributes["cicd.pipeline.result"] == "failure"
    context = await harness.engine.runs.by_id(await _run_id(harness, uid))
    history = await run_history(harness.pool, context.run_id)
    created = next(e.recorded_at for e in history if e.kind == "run.created")
    assert run.start_time == int(created.timestamp() * 1_000_000) * 1000
    refund, release = spans["compensate refund"], spans["compensate release"]
    assert refund.end_time is not None and release.start_time is not None
    assert refund.end_time <= release.start_time

    # another operator (a failover) sends the same run again: the same ids, the same times
    first = {
        (s.name, s.context.span_id, s.start_time, s.end_time)
        for s in exporter.get_finished_spans()
        if s.context
    }
    exporter.clear()
    tracer.saw(body)  # a new leader reads the annotation from its first list
    await tracer.send(harness.pool, context, RunPhase.FAILED)
    await tracer.drain()
    again = {
        (s.name, s.context.span_id, s.start_time, s.end_time)
        for s in exporter.get_finished_spans()
        if s.context
    }
    assert again == first


async def _run_id(harness: Harness, uid: str) -> int:
    from flowforge.store.queries import find_run_id_by_uid

    run_id = await find_run_id_by_uid(harness.pool, namespace="team-a", uid=uid)
    assert run_id is not None
    return run_id
