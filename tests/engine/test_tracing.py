"""The engine sends a run's trace when it becomes final, built from the real store's rows by
the trace exporter process, and each Job it creates carries its attempt's TRACEPARENT (fake
Kubernetes, real PostgreSQL, the real exporter process sending OTLP/HTTP to a receiver on
127.0.0.1); a standby starts no exporter until it leads."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from flowforge.domain.states import RunPhase, TaskRole
from flowforge.domain.tracing import TRACEPARENT_ANNOTATION, attempt_traceparent
from flowforge.operator import tracing
from flowforge.operator.leadership import Leadership
from flowforge.operator.trace_export import MODULE, NICENESS
from flowforge.store.connection import Pool
from flowforge.store.events import run_history
from flowforge.store.lease import acquire_lease, release_lease
from tests.engine.conftest import Harness
from tests.support.otlp import OtlpReceiver, otlp_receiver
from tests.support.waiting import wait_until
from tests.support.workflows import SAGA

pytestmark = pytest.mark.store

CREATOR = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _environ(received: OtlpReceiver) -> dict[str, str]:
    return {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": received.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


@pytest.fixture
async def receiver(
    harness: Harness, store_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[OtlpReceiver]:
    with otlp_receiver() as received:
        monkeypatch.setattr(tracing, "_tracer", None)
        tracer = tracing.configure(
            dsn=store_dsn,
            leading=harness.engine.leadership.wait_until_leader,
            environ=_environ(received),
        )
        assert tracer is not None
        try:
            yield received
        finally:
            await tracer.close()


def _exporter() -> tuple[int, int] | None:
    """(pid, nice) of this process's trace exporter child."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):  # it ended
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and MODULE.encode() in command and fields[0] != "Z":
            return int(entry.name), int(fields[16])
    return None


def _times(spans: list[Span]) -> set[tuple[str, bytes, int, int]]:
    return {(s.name, s.span_id, s.start_time_unix_nano, s.end_time_unix_nano) for s in spans}


async def test_a_finished_saga_sends_its_trace_from_the_stores_rows(
    harness: Harness, receiver: OtlpReceiver
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
    assert await tracer.drain()

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
    spans = {span.name: span for span in receiver.spans()}
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
    assert run.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert run.parent_span_id.hex() == "00f067aa0ba902b7"
    attributes = {a.key: a.value.string_value for a in run.attributes}
    assert attributes["cicd.pipeline.result"] == "failure"
    context = await harness.engine.runs.by_id(await _run_id(harness, uid))
    history = await run_history(harness.pool, context.run_id)
    created = next(e.recorded_at for e in history if e.kind == "run.created")
    assert run.start_time_unix_nano == int(created.timestamp() * 1_000_000) * 1000
    refund, release = spans["compensate refund"], spans["compensate release"]
    assert refund.end_time_unix_nano <= release.start_time_unix_nano

    # the exporter runs below the engine's priority; killed, it is started again
    first = _times(receiver.spans())
    found = _exporter()
    assert found is not None
    pid, nice = found
    assert nice == min(os.nice(0) + NICENESS, 19)
    os.kill(pid, 9)
    await wait_until(
        lambda: (again := _exporter()) is not None and again[0] != pid,
        timeout=20,
        what="the trace exporter started again",
    )
    # and another operator (a failover) sends the same run again: the same ids and times
    receiver.clear()
    tracer.saw(body)  # a new leader reads the annotation from its first list
    tracer.finished(context, RunPhase.FAILED)
    assert await tracer.drain()
    assert _times(receiver.spans()) == first


async def test_a_standby_starts_its_exporter_only_when_it_takes_the_lease(
    store: Pool, store_dsn: str, statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await acquire_lease(store, holder="op-a", ttl=timedelta(minutes=5))
    assert held is not None
    standby = Leadership(store, identity="op-b", ttl=timedelta(minutes=5), renew_every=0.05)
    monkeypatch.setattr(tracing, "_tracer", None)

    def attempts() -> int:
        return sum("INSERT INTO flowforge_lease" in statement for statement in statements)

    with otlp_receiver() as received:
        tracer = tracing.configure(
            dsn=store_dsn, leading=standby.wait_until_leader, environ=_environ(received)
        )
        assert tracer is not None
        leading = asyncio.create_task(standby.run())
        try:
            # op-a's acquisition, then three refused ones of the standby's
            await wait_until(lambda: attempts() >= 4, what="the standby's attempts")
            assert not standby.is_leader and _exporter() is None
            assert await release_lease(store, held)
            await wait_until(_exporter, what="the new leader's trace exporter", timeout=20)
            assert standby.is_leader
            assert await tracer.drain()  # the exporter answers
        finally:
            leading.cancel()
            await asyncio.gather(leading, return_exceptions=True)
            await tracer.close()


async def _run_id(harness: Harness, uid: str) -> int:
    from flowforge.store.queries import find_run_id_by_uid

    run_id = await find_run_id_by_uid(harness.pool, namespace="team-a", uid=uid)
    assert run_id is not None
    return run_id
