"""OpenTelemetry traces of runs: sent when a run becomes final, from the store's history.

Configured the standard way: tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, unless ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``; the OTLP/HTTP exporter and the batch processor read their own
``OTEL_*`` variables (headers, timeout, compression, batch sizes), ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` name the resource. Off, nothing is started and every call here
returns at once.

On, a finished run's trace costs this process one line on a bounded queue: the run's id and
facts. A child process (``operator/trace_export.py``, at a lower priority) reads the run's
history over its own connection, builds the spans and sends them; this process never imports
the SDK. The child starts when this operator first leads: a standby finishes no runs, so it
runs no exporter (and spends no memory on one); once started it stays after a lost lease (a
leader that stopped acting may act again, with traces still queued). A full queue drops the
trace and counts it (``flowforge_traces_dropped_total``): the engine never waits for
telemetry. A child that dies is logged and started again. The only memory here is the
creator's ``flowforge.io/traceparent`` of the active runs that carry one, read again from the
object at every sighting (so a new leader learns it from its first list).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cachetools import LRUCache

from flowforge.domain.states import RunPhase, TaskRole
from flowforge.domain.tracing import TRACEPARENT_ANNOTATION, RunFacts, attempt_traceparent
from flowforge.operator import metrics
from flowforge.operator.runs import RunContext
from flowforge.operator.trace_export import MODULE, flush_message, run_message

logger = logging.getLogger(__name__)

# active runs whose object carries a traceparent (forgotten when the run's trace is queued)
REMEMBERED_PARENTS = 10_000
QUEUE_SIZE = 10_000  # traces waiting for the exporter (a line of a few hundred bytes each)
# a dead exporter is started again after this, doubled while it keeps dying young
RESTART_SECONDS = 1.0
RESTART_CAP_SECONDS = 60.0
SHUTDOWN_SECONDS = 5.0  # the longest a stopping operator waits for the queued traces


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


class RunTracer:
    """Queues each finished run's trace for the exporter process it keeps running; names each
    Job's attempt span in ``TRACEPARENT``."""

    def __init__(
        self, *, dsn: str, environ: Mapping[str, str], queue_size: int = QUEUE_SIZE
    ) -> None:
        self._environ = {**environ, "FLOWFORGE_DSN": dsn}
        self._parents: LRUCache[str, str] = LRUCache(maxsize=REMEMBERED_PARENTS)
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=queue_size)
        self._flushes: dict[int, asyncio.Future[bool]] = {}
        self._numbers = itertools.count()
        self._process: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False

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

    def finished(self, context: RunContext, phase: RunPhase) -> None:
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
        try:
            self._queue.put_nowait(run_message(context.run_id, facts))
        except asyncio.QueueFull:
            metrics.TRACES_DROPPED.inc()

    def start(self, *, leading: Callable[[], Awaitable[object]]) -> None:
        """Run the exporter once ``leading`` returns (the lease is held), and keep it running."""
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(leading), name="flowforge-traces"
        )

    async def drain(self) -> bool:
        """Wait until every trace queued before is exported (tests, shutdown); False when the
        exporter died first."""
        number = next(self._numbers)
        answered: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._flushes[number] = answered
        await self._queue.put(flush_message(number))
        return await answered

    async def close(self, *, deadline_seconds: float = SHUTDOWN_SECONDS) -> None:
        """Drain, within the deadline, and stop the exporter (a standby's stop: at once)."""
        if self._process is not None or not self._queue.empty():
            try:
                async with asyncio.timeout(deadline_seconds):
                    await self.drain()
            except TimeoutError:
                left = self._queue.qsize()
                metrics.TRACES_DROPPED.inc(left)
                logger.warning("tracing: stopped with %d traces not sent", left)
        self._closing = True
        process = self._process
        if process is not None and process.returncode is None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), timeout=deadline_seconds)
            except TimeoutError:
                process.kill()
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)

    async def _supervise(self, leading: Callable[[], Awaitable[object]]) -> None:
        await leading()
        logger.info("tracing: leading, the trace exporter starts")
        delay = RESTART_SECONDS
        while not self._closing:
            started = time.monotonic()
            try:
                process = self._process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    MODULE,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    env=self._environ,
                )
            except OSError:
                logger.exception("tracing: the trace exporter did not start")
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESTART_CAP_SECONDS)
                continue
            assert process.stdin is not None and process.stdout is not None
            pumps = [
                asyncio.create_task(self._write(process.stdin)),
                asyncio.create_task(self._read_flushes(process.stdout)),
            ]
            try:
                code = await process.wait()
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                for answered in self._flushes.values():
                    if not answered.done():
                        answered.set_result(False)
                self._flushes.clear()
            if self._closing:
                return
            if time.monotonic() - started > RESTART_CAP_SECONDS:
                delay = RESTART_SECONDS  # it had lived: not a crash loop
            logger.error(
                "tracing: the trace exporter (pid %d) exited with %s; the traces it held are "
                "lost; starting it again in %.0f s",
                process.pid,
                code,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_CAP_SECONDS)

    async def _write(self, stdin: asyncio.StreamWriter) -> None:
        while True:
            line = await self._queue.get()
            stdin.write(line)
            await stdin.drain()  # a slow exporter fills the pipe, then the queue

    async def _read_flushes(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            if not line.strip().isdigit():  # a library's print: not the exporter's answer
                continue
            answered = self._flushes.pop(int(line), None)
            if answered is not None and not answered.done():
                answered.set_result(True)


_tracer: RunTracer | None = None


def configure(
    *,
    dsn: str,
    leading: Callable[[], Awaitable[object]],
    environ: Mapping[str, str] | None = None,
) -> RunTracer | None:
    """Turn tracing on when the environment asks for it (the operator's start-up, in its
    event loop): the exporter process starts once ``leading`` returns."""
    global _tracer
    environ = os.environ if environ is None else environ
    if _tracer is None and enabled_by(environ):
        _tracer = RunTracer(dsn=dsn, environ=environ)
        _tracer.start(leading=leading)
        logger.info("tracing: runs' traces go to the OTLP endpoint through a child process")
    return _tracer


async def shutdown() -> None:
    """The operator stops: the queued traces are sent, within ``SHUTDOWN_SECONDS``."""
    if _tracer is not None:
        await _tracer.close()


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


def run_finished(context: RunContext, phase: RunPhase) -> None:
    if _tracer is not None:
        _tracer.finished(context, phase)
