"""The trace exporter: a child process of the operator that sends finished runs' traces.

``python -m flowforge.operator.trace_export``, started by ``operator/tracing.py`` when tracing
is on. It reads one JSON line per finished run from its stdin (the run's id and the facts of
``RunFacts``), reads the run's history over a connection of its own (``FLOWFORGE_DSN``, the
operator's), builds the spans (``domain/tracing.py::run_spans``) and hands them to the
OpenTelemetry SDK's batch processor, which serialises and sends OTLP on its own thread. A
``flush`` line is answered on stdout once every line before it is exported. All of this runs
at a lower priority (``os.nice``): a trace is telemetry, it may be late, the runs may not.

Its stdin closing (the operator stopped, or died) makes it export what it has read and exit.
Only this process imports the SDK.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from flowforge.domain.states import RunPhase
from flowforge.domain.tracing import RunFacts, SpanRecord, TraceContext, run_spans
from flowforge.store.connection import Pool
from flowforge.store.events import run_history
from flowforge.store.pool import open_pool
from flowforge.store.session import SessionLimits

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger(__name__)

MODULE = "flowforge.operator.trace_export"
NICENESS = 10
LINE_LIMIT = 1 << 20  # a message is one run's facts: far below this


def run_message(run_id: int, facts: RunFacts) -> bytes:
    """The line that asks for a run's trace."""
    fields = {**dataclasses.asdict(facts), "phase": facts.phase.value}
    return json.dumps({"run": run_id, "facts": fields}).encode() + b"\n"


def flush_message(number: int) -> bytes:
    """The line answered with ``number`` on stdout once every earlier trace is exported."""
    return json.dumps({"flush": number}).encode() + b"\n"


def read_message(line: bytes) -> tuple[int, RunFacts] | int:
    """A run's (id, facts), or a flush's number."""
    message = json.loads(line)
    if "flush" in message:
        return int(message["flush"])
    facts: dict[str, Any] = message["facts"]
    return int(message["run"]), RunFacts(**{**facts, "phase": RunPhase(facts["phase"])})


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


async def export_run(pool: Pool, sender: SpanSender, *, run_id: int, facts: RunFacts) -> None:
    try:
        events = await run_history(pool, run_id)
        trace, spans = run_spans(facts, events)
        sender.send(trace, spans)
    except Exception:  # one run's trace is never worth the others'
        logger.exception("the trace of run %s/%s was not sent", facts.namespace, facts.name)


async def serve(
    lines: asyncio.StreamReader, answers: IO[bytes], *, pool: Pool, sender: SpanSender
) -> None:
    """Export each run read from ``lines``, in order, until they end."""
    while line := await lines.readline():
        message = read_message(line)
        if isinstance(message, int):
            await asyncio.to_thread(sender.flush)
            answers.write(b"%d\n" % message)
            answers.flush()
        else:
            await export_run(pool, sender, run_id=message[0], facts=message[1])


async def _main(environ: Mapping[str, str]) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    sender = SpanSender(
        OTLPSpanExporter(),  # reads OTEL_EXPORTER_OTLP_* itself
        service_name=environ.get("OTEL_SERVICE_NAME") or "flowforge-operator",
    )
    pool = await open_pool(
        environ["FLOWFORGE_DSN"],
        min_size=1,
        max_size=1,
        verify_schema=False,  # the operator checked it
        name="flowforge-traces",
        limits=SessionLimits(),
    )
    lines = asyncio.StreamReader(limit=LINE_LIMIT)
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(lines), sys.stdin.buffer
    )
    try:
        await serve(lines, sys.stdout.buffer, pool=pool, sender=sender)
    finally:
        sender.shutdown()  # sends what the processor holds
        await pool.close()


def main() -> None:
    os.nice(NICENESS)
    # a terminal's Ctrl-C reaches the whole group: the operator closes our stdin when it stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s [%(levelname)s] flowforge-traces: %(message)s"
    )
    asyncio.run(_main(os.environ))


if __name__ == "__main__":
    main()
