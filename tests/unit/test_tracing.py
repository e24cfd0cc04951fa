"""A run's trace from its recorded history (domain/tracing.py), the Job's TRACEPARENT, and the
spans as the OpenTelemetry SDK exports them (operator/trace_export.py), the bounded queue to the
exporter process (operator/tracing.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.domain.history import EventKind
from flowforge.domain.states import RunPhase, TaskRole
from flowforge.domain.tracing import (
    RunFacts,
    SpanRecord,
    attempt_traceparent,
    parse_traceparent,
    run_spans,
    span_id,
    trace_context,
)
from flowforge.kube.jobs import JobRequest, build_job
from flowforge.operator import metrics, trace_export, tracing

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
UID = "8c1f6a55-3f0e-4b8e-9d55-0d7d7a1f2b10"
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclasses.dataclass(frozen=True)
class Row:
    kind: str
    task_key: str | None
    attempt: int | None
    recorded_at: datetime
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def saga_history() -> list[Row]:
    """a -> b -> c; c fails twice (a retry), the rollback undoes b then a; a never-run d."""
    failed = {"reason": "Failed", "message": "exit 3", "exitCode": 3}
    return [
        Row(EventKind.RUN_CREATED, None, None, at(0)),
        Row(EventKind.TASK_DISPATCHED, "a", 1, at(0.1)),
        Row(EventKind.TASK_JOB_CREATED, "a", 1, at(0.2)),
        Row(EventKind.TASK_SUCCEEDED, "a", 1, at(2), {"reason": "Succeeded", "exitCode": 0}),
        Row(EventKind.TASK_RELEASED, "b", None, at(2)),
        Row(EventKind.TASK_DISPATCHED, "b", 1, at(2.1)),
        Row(EventKind.TASK_SUCCEEDED, "b", 1, at(4)),
        Row(EventKind.TASK_RELEASED, "c", None, at(4)),
        Row(EventKind.TASK_DISPATCHED, "c", 1, at(4.1)),
        Row(EventKind.TASK_ATTEMPT_FAILED, "c", 1, at(5), failed),
        Row(EventKind.TASK_DISPATCHED, "c", 2, at(6)),
        Row(EventKind.TASK_FAILED, "c", 2, at(7), failed),
        Row(EventKind.TASK_SKIPPED, "d", None, at(7)),
        Row(EventKind.RUN_COMPENSATING, None, None, at(7)),
        Row(EventKind.COMPENSATION_TRIGGERED, "undo-a", None, at(7)),
        Row(EventKind.COMPENSATION_TRIGGERED, "undo-b", None, at(7)),
        Row(EventKind.COMPENSATION_STARTED, "undo-b", 1, at(7.1)),
        Row(EventKind.TASK_JOB_CREATED, "undo-b", 1, at(7.2)),  # recorded for every Job
        Row(EventKind.COMPENSATION_SUCCEEDED, "undo-b", 1, at(8)),
        Row(EventKind.COMPENSATION_STARTED, "undo-a", 1, at(8.1)),
        Row(EventKind.COMPENSATION_SUCCEEDED, "undo-a", 1, at(9)),
        Row(EventKind.RUN_FAILED, None, None, at(9)),
    ]


def facts(**overrides: Any) -> RunFacts:
    values: dict[str, Any] = {
        "namespace": "shop",
        "name": "order-1001",
        "uid": UID,
        "workflow": "order",
        "version": 2,
        "phase": RunPhase.FAILED,
    }
    return RunFacts(**{**values, **overrides})


def by_name(spans: Sequence[SpanRecord]) -> dict[str, SpanRecord]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), "span names repeat"
    return named


def test_a_saga_run_is_one_tree_with_the_recorded_times() -> None:
    context, spans = run_spans(facts(), saga_history())
    named = by_name(spans)
    run = named["RUN order"]
    assert (run.parent_id, run.start, run.end, run.server) == (None, at(0), at(9), True)
    assert run.attributes["cicd.pipeline.result"] == "failure"
    assert run.attributes["cicd.pipeline.run.id"] == UID
    assert run.error == "the run ended Failed"
    for key, (start, end) in {"a": (0.1, 2), "b": (2, 4), "c": (4, 7)}.items():
        task = named[key]
        assert (task.parent_id, task.start, task.end) == (run.span_id, at(start), at(end))
        assert task.attributes["cicd.pipeline.task.name"] == key
    assert named["c"].attributes["cicd.pipeline.task.run.result"] == "failure"
    first, second = named["c attempt 1"], named["c attempt 2"]
    assert (first.parent_id, first.start, first.end) == (named["c"].span_id, at(4.1), at(5))
    assert (second.start, second.end) == (at(6), at(7))
    assert second.attributes["process.exit.code"] == 3
    assert second.error == "Failed: exit 3"
    assert named["a attempt 1"].error is None
    assert "d" not in named  # skipped, never ran: no span
    rollback = named["rollback"]
    assert (rollback.parent_id, rollback.start, rollback.end) == (run.span_id, at(7), at(9))
    undo_b, undo_a = named["compensate undo-b"], named["compensate undo-a"]
    assert undo_b.parent_id == undo_a.parent_id == rollback.span_id
    assert (undo_b.start, undo_b.end, undo_a.start, undo_a.end) == (
        at(7.1),
        at(8),
        at(8.1),
        at(9),
    )
    assert named["undo-b attempt 1"].start < named["undo-a attempt 1"].start  # in order
    assert named["undo-a attempt 1"].parent_id == undo_a.span_id
    assert context.parent_span_id is None
    assert len({span.span_id for span in spans}) == len(spans) == 13


def test_the_same_rows_give_the_same_ids_so_a_second_emission_repeats_the_first() -> None:
    assert run_spans(facts(), saga_history()) == run_spans(facts(), saga_history())
    other = run_spans(facts(uid="another-uid"), saga_history())
    assert not {s.span_id for s in other[1]} & {
        s.span_id for s in run_spans(facts(), saga_history())[1]
    }


def test_a_run_with_a_traceparent_joins_its_creators_trace() -> None:
    context, spans = run_spans(facts(traceparent=PARENT), saga_history())
    assert context.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert context.parent_span_id == "00f067aa0ba902b7"
    assert by_name(spans)["RUN order"].parent_id is None  # its parent is the creator's span
    own = trace_context(uid=UID, traceparent="not a traceparent")
    assert own.parent_span_id is None and len(own.trace_id) == 32


def test_a_succeeded_run_has_no_rollback_and_no_error() -> None:
    history = [
        Row(EventKind.RUN_CREATED, None, None, at(0)),
        Row(EventKind.TASK_DISPATCHED, "a", 1, at(0.1)),
        Row(EventKind.TASK_SUCCEEDED, "a", 1, at(1)),
        Row(EventKind.RUN_SUCCEEDED, None, None, at(1)),
    ]
    _, spans = run_spans(facts(phase=RunPhase.SUCCEEDED), history)
    assert [span.name for span in spans] == ["RUN order", "a", "a attempt 1"]
    assert all(span.error is None for span in spans)
    assert spans[0].attributes["cicd.pipeline.result"] == "success"
    assert run_spans(facts(), []) == (trace_context(uid=UID, traceparent=None), [])


def test_a_cancelled_attempt_ends_with_its_task() -> None:
    history = [
        Row(EventKind.RUN_CREATED, None, None, at(0)),
        Row(EventKind.TASK_DISPATCHED, "a", 1, at(0.1)),
        Row(EventKind.RUN_CANCEL_REQUESTED, None, None, at(3)),
        Row(EventKind.TASK_CANCELLED, "a", None, at(3)),
        Row(EventKind.RUN_CANCELLED, None, None, at(3.5)),
    ]
    named = by_name(run_spans(facts(phase=RunPhase.CANCELLED), history)[1])
    assert named["a attempt 1"].end == at(3)
    assert named["a"].attributes["cicd.pipeline.task.run.result"] == "cancellation"
    assert named["RUN order"].attributes["cicd.pipeline.result"] == "cancellation"


def test_a_jobs_traceparent_names_its_attempts_span() -> None:
    _, spans = run_spans(facts(traceparent=PARENT), saga_history())
    named = by_name(spans)
    forward = attempt_traceparent(
        uid=UID, traceparent=PARENT, role=TaskRole.FORWARD, task_key="c", attempt=2
    )
    assert forward == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{named['c attempt 2'].span_id}-01"
    undo = attempt_traceparent(
        uid=UID, traceparent=None, role=TaskRole.COMPENSATION, task_key="undo-a", attempt=1
    )
    assert undo.split("-")[2] == named["undo-a attempt 1"].span_id
    assert parse_traceparent(undo) == (
        trace_context(uid=UID, traceparent=None).trace_id,
        span_id(UID, "compensator", "undo-a", "1"),
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    ],
)
def test_malformed_traceparents_are_ignored(text: str) -> None:
    assert parse_traceparent(text) is None


def _env(job: Mapping[str, Any]) -> dict[str, str]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {entry["name"]: entry.get("value") for entry in container["env"]}


def test_a_job_carries_traceparent_only_while_tracing_is_on() -> None:
    request = JobRequest(
        namespace="shop",
        run_name="order-1001",
        run_uid=UID,
        task_key="c",
        attempt=2,
        role=TaskRole.FORWARD,
        template={"image": "busybox", "env": [{"name": "TRACEPARENT", "value": "theirs"}]},
    )
    assert _env(build_job(request))["TRACEPARENT"] == "theirs"
    ours = attempt_traceparent(
        uid=UID, traceparent=None, role=TaskRole.FORWARD, task_key="c", attempt=2
    )
    traced = dataclasses.replace(request, traceparent=ours)
    assert _env(build_job(traced))["TRACEPARENT"] == ours


def test_tracing_is_configured_by_the_standard_variables() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.enabled_by(endpoint)
    assert tracing.enabled_by(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}
    )
    assert not tracing.enabled_by({})
    assert not tracing.enabled_by({**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not tracing.enabled_by({**endpoint, "OTEL_TRACES_EXPORTER": "none"})


def test_off_imports_nothing_of_opentelemetry() -> None:
    code = (
        "import asyncio, sys; from flowforge.operator import handlers, tracing; "
        "assert tracing.configure(dsn='', leading=asyncio.Event().wait, environ={}) is None; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_sdk_exports_the_tree_with_its_ids_times_and_parent() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, StatusCode

    exporter = InMemorySpanExporter()
    sender = trace_export.SpanSender(exporter, service_name="flowforge-test")
    context, spans = run_spans(facts(traceparent=PARENT), saga_history())
    sender.send(context, spans)
    assert sender.flush()
    exported = {span.name: span for span in exporter.get_finished_spans()}
    assert len(exported) == len(spans)
    run = exported["RUN order"]
    assert run.kind is SpanKind.SERVER
    assert run.status.status_code is StatusCode.ERROR
    assert run.parent is not None and run.parent.span_id == int("00f067aa0ba902b7", 16)
    assert run.context is not None
    assert f"{run.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert run.start_time == int(at(0).timestamp()) * 10**9
    assert run.end_time == int(at(9).timestamp()) * 10**9
    attempt = exported["c attempt 2"]
    assert attempt.parent is not None
    assert attempt.parent.span_id == exported["c"].context.span_id  # type: ignore[union-attr]
    assert run.resource.attributes["service.name"] == "flowforge-test"
    sender.shutdown()


async def test_the_tracer_remembers_a_creators_parent_until_the_trace_is_queued() -> None:
    tracer = tracing.RunTracer(dsn="", environ={})  # never started: the queue only fills
    tracer.saw({"metadata": {"uid": UID, "annotations": {"flowforge.io/traceparent": PARENT}}})
    context = _Context(uid=UID, run_id=7)
    parent = tracer.job_traceparent(context, role=TaskRole.FORWARD, task_key="a", attempt=1)  # type: ignore[arg-type]
    assert parent.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    tracer.finished(context, RunPhase.FAILED)  # type: ignore[arg-type]
    again = tracer.job_traceparent(context, role=TaskRole.FORWARD, task_key="a", attempt=1)  # type: ignore[arg-type]
    assert not again.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")  # forgotten once queued


def _dropped() -> float:
    return metrics.REGISTRY.get_sample_value("flowforge_traces_dropped_total") or 0.0


async def test_a_full_queue_drops_the_trace_and_counts_it_and_a_stop_waits_only_its_deadline() -> (
    None
):
    tracer = tracing.RunTracer(dsn="", environ={}, queue_size=2)  # no exporter reads it
    before = _dropped()
    for run_id in (1, 2, 3, 4):
        tracer.finished(_Context(uid=f"uid-{run_id}", run_id=run_id), RunPhase.SUCCEEDED)  # type: ignore[arg-type]
    assert _dropped() == before + 2  # the engine went on: 3 and 4 were dropped at once

    started = time.monotonic()
    await tracer.close(deadline_seconds=0.2)
    assert time.monotonic() - started < 2
    assert _dropped() == before + 4  # the two still queued when the deadline passed


async def test_a_standby_stops_at_once_without_an_exporter() -> None:
    tracer = tracing.RunTracer(dsn="", environ={})
    tracer.start(leading=asyncio.Event().wait)  # never leads: no exporter is started
    before = _dropped()
    started = time.monotonic()
    await tracer.close(deadline_seconds=30)
    assert time.monotonic() - started < 2  # no drain waits for an exporter that never ran
    assert _dropped() == before


def test_a_runs_message_to_the_exporter_carries_its_facts() -> None:
    sent = facts(traceparent=PARENT)
    assert trace_export.read_message(trace_export.run_message(7, sent)) == (7, sent)
    assert trace_export.read_message(trace_export.flush_message(3)) == 3


@dataclasses.dataclass(frozen=True)
class _Spec:
    workflow: str = "order"
    version: int = 2


@dataclasses.dataclass(frozen=True)
class _Definition:
    spec: _Spec = dataclasses.field(default_factory=_Spec)


@dataclasses.dataclass(frozen=True)
class _Context:
    uid: str
    run_id: int
    namespace: str = "shop"
    name: str = "order-1001"
    definition: _Definition = dataclasses.field(default_factory=_Definition)


def test_finally_tasks_are_spans_of_their_own_under_the_run() -> None:
    history = [
        *saga_history()[:-1],  # the rollback settled; the outcome is decided
        Row(EventKind.RUN_FINALIZING, None, None, at(9)),
        Row(EventKind.FINALLY_STARTED, "notify", 1, at(9.1)),
        Row(EventKind.TASK_JOB_CREATED, "notify", 1, at(9.2)),
        Row(EventKind.FINALLY_ATTEMPT_FAILED, "notify", 1, at(10), {"exitCode": 1}),
        Row(EventKind.FINALLY_STARTED, "notify", 2, at(11)),
        Row(EventKind.FINALLY_SUCCEEDED, "notify", 2, at(12)),
        Row(EventKind.RUN_FAILED, None, None, at(12)),
    ]

    named = by_name(run_spans(facts(), history)[1])

    final = named["finally notify"]
    assert final.parent_id == named["RUN order"].span_id
    assert (final.start, final.end) == (at(9.1), at(12))
    assert final.attributes["flowforge.task.role"] == "finally"
    assert final.attributes["cicd.pipeline.task.run.result"] == "success"
    assert named["notify attempt 1"].attributes["process.exit.code"] == 1
    assert (
        named["notify attempt 2"].span_id
        == attempt_traceparent(
            uid=UID, traceparent=None, role=TaskRole.FINALLY, task_key="notify", attempt=2
        ).split("-")[2]
    )
    assert "compensate undo-b" in named and named["RUN order"].end == at(12)
