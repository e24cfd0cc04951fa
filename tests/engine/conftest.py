"""The run engine against a real PostgreSQL and the in-memory Kubernetes fake.

``harness`` gives a leading Engine (its lease really acquired in the store), a Reconciler
and helpers to start runs and finish their Jobs as the Job controller would.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowforge.domain.decision import JobRef
from flowforge.domain.execution import BackoffPolicy
from flowforge.domain.history import EventKind
from flowforge.domain.states import TaskRole
from flowforge.domain.validation import parse_definition
from flowforge.kube.jobs import ANNOTATION_TASK_KEY, LABEL_ATTEMPT, LABEL_ROLE, LABEL_TASK
from flowforge.operator.background import Clock
from flowforge.operator.engine import Engine
from flowforge.operator.leadership import Leadership
from flowforge.operator.reconciler import Reconciler
from flowforge.operator.runs import RunContext
from flowforge.operator.settings import OperatorSettings
from flowforge.store.connection import Pool
from flowforge.store.definitions import publish_definition
from flowforge.store.events import RUN_NAMESPACE
from flowforge.store.queries import find_run_id_by_uid, list_tasks
from flowforge.store.runs import RunRecord, get_run
from tests.engine.fake_kube import FakeKube
from tests.support.waiting import wait_until  # noqa: F401 (test_run_actions.py imports it here)

pytestmark = pytest.mark.store

NAMESPACE = "team-a"


def task_of_job(job: Mapping[str, Any]) -> str:
    """The run task a Job runs (a forEach instance's exact key is an annotation)."""
    metadata = job["metadata"]
    return str(
        metadata.get("annotations", {}).get(ANNOTATION_TASK_KEY) or metadata["labels"][LABEL_TASK]
    )


@dataclasses.dataclass
class Harness:
    pool: Pool
    kube: FakeKube
    engine: Engine
    reconciler: Reconciler

    async def start(
        self,
        name: str,
        tasks: Sequence[Mapping[str, Any]],
        *,
        task_type: Mapping[str, Any] | None = None,
        namespace: str = NAMESPACE,
    ) -> RunContext:
        body = await self.unstarted(name, tasks, task_type=task_type, namespace=namespace)
        await self.engine.start_run(body)
        run_id = await find_run_id_by_uid(
            self.pool, namespace=namespace, uid=body["metadata"]["uid"]
        )
        assert run_id is not None
        return await self.engine.runs.by_id(run_id)

    async def unstarted(
        self,
        name: str,
        tasks: Sequence[Mapping[str, Any]],
        *,
        task_type: Mapping[str, Any] | None = None,
        namespace: str = NAMESPACE,
    ) -> dict[str, Any]:
        """A published definition and a WorkflowRun object of it whose watch event was
        missed (the store holds no run for it yet)."""
        document: dict[str, Any] = {
            "workflow": name,
            "version": 1,
            "taskTypes": {"py": {"image": "python:3.12-slim", **(task_type or {})}},
            # an approval gate (``approval``) has no type: it runs no Job
            "tasks": [task if "approval" in task else {"type": "py", **task} for task in tasks],
        }
        await publish_definition(
            self.pool, namespace=namespace, definition=parse_definition(document)
        )
        return self.stored_run(name, workflow=name, namespace=namespace)

    def stored_run(self, name: str, *, workflow: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        """A WorkflowRun object of version 1 of ``workflow``, as the apiserver stores it."""
        body: dict[str, Any] = {
            "apiVersion": "flowforge.io/v1alpha1",
            "kind": "WorkflowRun",
            "metadata": {"namespace": namespace, "name": name, "uid": str(uuid.uuid4())},
            "spec": {"workflow": workflow, "version": 1},
        }
        self.kube.runs[(namespace, name)] = body
        return body

    def job_of(self, task_key: str, *, attempt: int = 1) -> str:
        for (_, name), job in self.kube.jobs.items():
            labels = job["metadata"]["labels"]
            if task_of_job(job) == task_key and labels[LABEL_ATTEMPT] == str(attempt):
                return name
        raise AssertionError(f"no Job for {task_key} attempt {attempt}: {sorted(self.kube.jobs)}")

    def ref(self, task_key: str, *, attempt: int = 1) -> JobRef:
        return JobRef(task_key, attempt, TaskRole.FORWARD)

    def job_of_created(self, task_key: str, *, attempt: int = 1) -> str:
        """The name of a Job that was created for the attempt, even if it is gone now."""
        for name in self.kube.created:
            if f"-{task_key}-{attempt}-" in name:
                return name
        raise AssertionError(f"no Job was created for {task_key} attempt {attempt}")

    async def finish(self, task_key: str, *, succeeded: bool = True, attempt: int = 1) -> None:
        job = self.kube.finish(self.job_of(task_key, attempt=attempt), succeeded=succeeded)
        await self.engine.on_job_event(job, "MODIFIED")
        await self.settle_background()

    async def settle_background(self) -> None:
        for _ in range(5):  # Events and timers are spawned work: let them run
            await asyncio.sleep(0)

    async def age_job(
        self, context: RunContext, name: str, *, seconds: float, recorded: bool = True
    ) -> None:
        """Make the Job look created ``seconds`` ago: its creationTimestamp, and (with
        ``recorded``) the store's record of its creation, as if the operator had recorded it
        then (a row of history like the one it wrote, earlier)."""
        self.kube.age_job(name, seconds=seconds)
        if not recorded:
            return
        metadata = next(job for (_, n), job in self.kube.jobs.items() if n == name)["metadata"]
        fence = self.engine.fence()
        async with self.pool.connection() as connection:
            await connection.execute(
                "INSERT INTO flowforge_event (run_id, namespace, task_key, attempt, kind, epoch, "
                f"detail, recorded_at) VALUES (%s, {RUN_NAMESPACE}, %s, %s, %s, %s, %s, "
                "clock_timestamp() - %s)",
                (
                    context.run_id,
                    context.run_id,
                    metadata["labels"][LABEL_TASK],
                    int(metadata["labels"][LABEL_ATTEMPT]),
                    EventKind.TASK_JOB_CREATED,
                    fence.epoch,
                    Jsonb({"job": name, "created": True, "uid": metadata["uid"]}),
                    timedelta(seconds=seconds),
                ),
            )

    def roles_created(self) -> list[tuple[str, str]]:
        found = []
        for name in self.kube.created:
            job = next((j for (_, n), j in self.kube.jobs.items() if n == name), None)
            if job is not None:
                found.append((job["metadata"]["labels"][LABEL_ROLE], task_of_job(job)))
        return found

    async def states(self, context: RunContext) -> dict[str, str]:
        return {row.task_key: row.state for row in await list_tasks(self.pool, context.run_id)}

    async def run(self, context: RunContext) -> RunRecord:
        return await get_run(self.pool, context.run_id)


def engine_settings(**overrides: Any) -> OperatorSettings:
    """The engine tests' settings: fast backoffs, Jobs kept (no TTL) unless a test sets
    ``job_ttl_seconds``, and Job creations not paced unless it sets ``job_creation_qps``."""
    defaults: dict[str, Any] = {
        "dsn": "",
        "job_ttl_seconds": -1,
        "job_creation_qps": 0.0,
        "backoff": BackoffPolicy(first_delay_seconds=0.05, jitter=0.0),
        "job_creation_retry": BackoffPolicy(first_delay_seconds=0.05, cap_seconds=0.2),
        "identity": "engine-test",
    }
    return OperatorSettings(**{**defaults, **overrides})


@contextlib.asynccontextmanager
async def open_harness(
    store: Pool, *, settings: OperatorSettings, clock: Clock | None = None
) -> AsyncIterator[Harness]:
    """A leading Engine (its lease really acquired in the store) on the Kubernetes fake;
    ``clock``: a fake clock for its deferred work (the event loop's by default)."""
    leadership = Leadership(
        store, identity=settings.identity, ttl=timedelta(minutes=5), renew_every=60
    )
    leading = asyncio.create_task(leadership.run())
    await asyncio.wait_for(leadership.wait_until_leader(), timeout=10)
    kube = FakeKube()
    engine = Engine(pool=store, kube=kube, settings=settings, leadership=leadership, clock=clock)
    try:
        yield Harness(
            pool=store, kube=kube, engine=engine, reconciler=Reconciler(engine, interval=3600)
        )
    finally:
        await engine.shutdown()
        leading.cancel()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every statement the store's connections execute from now on."""
    seen: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counted(self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(query))
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
    return seen


@pytest.fixture
async def harness(store: Pool) -> AsyncIterator[Harness]:
    async with open_harness(store, settings=engine_settings()) as opened:
        yield opened
