"""OpenTelemetry traces of runs: sent when a run becomes final, from the store's history.

Configured the standard way: tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, unless ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``; the OTLP/HTTP exporter and the batch processor read their own
``OTEL_*`` variables (headers, timeout, compression, batch sizes), ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` name the resource. Off, nothing of the SDK is imported and every
call here returns at once.

Nothing is held open: ``run_finished`` reads the run's history (``store/events.py``) and
``domain/tracing.py`` turns it into spans with their recorded times and ids derived from the
run's uid; they go to the SDK's batch processor as finished spans. The only memory is the
creator's ``flowforge.io/traceparent`` of the active runs that carry one, read again from the
object at every sighting (so a new leader learns it from its first list).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache

from flowforge.domain.states import RunPhase, TaskRole
from flowforge.domain.tracing import (
    TRACEPARENT_ANNOTATION,
    RunFacts,
    SpanRecord,
    TraceContext,
    attempt_traceparent,
    run_spans,
)
from flowforge.operator.runs import RunContext
from flowforge.store.connection import Pool
from flowforge.store.events import run_history

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger(__name__)

# active runs whose object carries a traceparent (forgotten when the run's trace is sent)
REMEMBERED_PARENTS = 10_000


def enabled_by(environ: Mapping[str, str]) -> bool:
    """Whether the standard OTEL_* variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in {"none", ""}:
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


class SpanSender:
    """The SDK's side: an exporter behind a batch processor (the SDK is imported only here)."""

    def __init__(self, exporter: SpanExporter, *, service_name: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self._resource = Resource.create({"service.name": service_name})
        self._processor = BatchSpanProcessor(exporter)

    def send(self, context: TraceContext, spans: Sequence[SpanRecord]) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        trace_id = int(context.trace_id, 16)
        sampled = TraceFlags(TraceFlags.SAMPLED)
        scope = InstrumentationScope("flowforge.operator.tracing")

        def span_context(span_id: str, *, remote: bool = False) -> SpanContext:
            return SpanContext(trace_id, int(span_id, 16), is_remote=remote, trace_flags=sampled)

        for span in spans:
            if span.parent_id is not None:
                parent: SpanContext | None = span_context(span.parent_id)
            elif context.parent_span_id is not None:
                parent = span_context(context.parent_span_id, remote=True)
            else:
                parent = None
            self._processor.on_end(
                ReadableSpan(
                    name=span.name,
                    context=span_context(span.span_id),
                    parent=parent,
                    resource=self._resource,
                    attributes=dict(span.attributes),
                    kind=SpanKind.SERVER if span.server else SpanKind.INTERNAL,
                    status=Status(StatusCode.ERROR, span.error)
                    if span.error
                    else Status(StatusCode.OK),
                    start_time=_nanoseconds(span.start),
                    end_time=_nanoseconds(span.end),
                    instrumentation_scope=scope,
                )
            )

    def flush(self, timeout_seconds: float = 10.0) -> bool:
        return bool(self._processor.force_flush(int(timeout_seconds * 1000)))

    def shutdown(self) -> None:
        self._processor.shutdown()  # type: ignore[no-untyped-call]


def _nanoseconds(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000) * 1000


class RunTracer:
    """Sends each finished run's trace; names each Job's attempt span in ``TRACEPARENT``."""

    def __init__(self, sender: SpanSender) -> None:
        self._sender = sender
        self._parents: LRUCache[str, str] = LRUCache(maxsize=REMEMBERED_PARENTS)
        self._sending: set[asyncio.Task[None]] = set()

    def saw(self, body: Mapping[str, Any]) -> None:
        metadata = body.get("metadata") or {}
        parent = (metadata.get("annotations") or {}).get(TRACEPARENT_ANNOTATION)
        if parent:
            self._parents[str(metadata.get("uid"))] = str(parent)

    def job_traceparent(
        self, context: RunContext, *, role: TaskRole, task_key: str, attempt: int
    ) -> str:
        return attempt_traceparent(
            uid=context.uid,
            traceparent=self._parents.get(context.uid),
            role=role,
            task_key=task_key,
            attempt=attempt,
        )

    def finished(self, pool: Pool, context: RunContext, phase: RunPhase) -> None:
        task = asyncio.get_running_loop().create_task(self.send(pool, context, phase))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def send(self, pool: Pool, context: RunContext, phase: RunPhase) -> None:
        try:
            events = await run_history(pool, context.run_id)
            spec = context.definition.spec
            facts = RunFacts(
                namespace=context.namespace,
                name=context.name,
                uid=context.uid,
                workflow=spec.workflow,
                version=spec.version,
                phase=phase,
                traceparent=self._parents.pop(context.uid, None),
            )
            trace, spans = run_spans(facts, events)
            self._sender.send(trace, spans)
        except Exception:  # a trace is never worth a run's work
            logger.exception("the trace of run %s/%s was not sent", context.namespace, context.name)

    async def drain(self) -> None:
        """Wait for the traces being built and flush the processor (tests, shutdown)."""
        while self._sending:
            await asyncio.gather(*list(self._sending), return_exceptions=True)
        await asyncio.to_thread(self._sender.flush)


_tracer: RunTracer | None = None


def configure(environ: Mapping[str, str] | None = None) -> RunTracer | None:
    """Turn tracing on when the environment asks for it (the operator's start-up)."""
    global _tracer
    environ = os.environ if environ is None else environ
    if _tracer is None and enabled_by(environ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        sender = SpanSender(
            OTLPSpanExporter(),  # reads OTEL_EXPORTER_OTLP_* itself
            service_name=environ.get("OTEL_SERVICE_NAME") or "flowforge-operator",
        )
        atexit.register(sender.shutdown)
        _tracer = RunTracer(sender)
        logger.info("tracing: runs' traces go to the OTLP endpoint")
    return _tracer


def saw_run(body: Mapping[str, Any]) -> None:
    if _tracer is not None:
        _tracer.saw(body)


def job_traceparent(
    context: RunContext, *, role: TaskRole, task_key: str, attempt: int
) -> str | None:
    """The TRACEPARENT of an attempt's Job, or None while tracing is off."""
    if _tracer is None:
        return None
    return _tracer.job_traceparent(context, role=role, task_key=task_key, attempt=attempt)


def run_finished(pool: Pool, context: RunContext, phase: RunPhase) -> None:
    if _tracer is not None:
        _tracer.finished(pool, context, phase)
