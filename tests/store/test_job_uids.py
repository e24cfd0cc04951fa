"""The uid of each attempt's Job, recorded with ``task.job_created`` and read back (schema 3).

The operator believes an outcome only from the Job whose uid it recorded; these reads are
what it compares with, so they must answer the newest uid recorded for the attempt, and None
(not a wrong uid) for a Job recorded before uids were.
"""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from flowforge.domain.history import EventKind
from flowforge.store.browse import scoped_reader
from flowforge.store.connection import Pool
from flowforge.store.dispatch import JobCreated, dispatch_due, record_jobs_created
from flowforge.store.lease import Fence
from flowforge.store.queries import (
    job_created_attempts,
    recorded_job_uid,
    recorded_job_uid_on,
    recorded_jobs,
)
from tests.store.conftest import NAMESPACE, start_run

pytestmark = pytest.mark.store

TASKS = [{"key": "a"}, {"key": "b"}, {"key": "c"}]


async def test_the_newest_recorded_uid_of_each_attempt_is_read_back(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, TASKS)).run.id
    await dispatch_due(store, fence=fence, run_id=run_id)
    async with store.connection() as connection:  # as an operator before schema 3 wrote it
        await connection.execute(
            "INSERT INTO flowforge_event (run_id, namespace, task_key, attempt, kind, epoch, "
            "detail) SELECT id, namespace, 'c', 1, %s, %s, %s FROM flowforge_run WHERE id = %s",
            (EventKind.TASK_JOB_CREATED, fence.epoch, Jsonb({"job": "j-c"}), run_id),
        )
    for key, uid in (("a", "uid-a"), ("b", "uid-b-old"), ("b", "uid-b")):
        job = JobCreated(key, 1, job=f"j-{key}", uid=uid, created=uid.endswith("old"))
        await record_jobs_created(store, fence=fence, run_id=run_id, jobs=(job,))

    assert await recorded_jobs(store, run_id) == {
        ("a", 1): "uid-a",
        ("b", 1): "uid-b",
        ("c", 1): None,
    }
    assert await job_created_attempts(store, run_id) == {("a", 1), ("b", 1), ("c", 1)}
    assert await recorded_job_uid(store, run_id=run_id, task_key="b", attempt=1) == "uid-b"
    assert await recorded_job_uid(store, run_id=run_id, task_key="c", attempt=1) is None
    assert await recorded_job_uid(store, run_id=run_id, task_key="a", attempt=2) is None


async def test_the_read_api_reads_the_recorded_uid_only_in_its_scope(
    store: Pool, fence: Fence, server_pool: Pool
) -> None:
    """The log endpoint picks the Pod by this uid, read as the server within its scope."""
    run_id = (await start_run(store, fence, TASKS)).run.id
    await dispatch_due(store, fence=fence, run_id=run_id)
    job = JobCreated("a", 1, job="j-a", uid="uid-a", created=True)
    await record_jobs_created(store, fence=fence, run_id=run_id, jobs=(job,))
    found = {}
    for namespace in (NAMESPACE, "team-b"):
        async with scoped_reader(server_pool, [namespace], namespace_uids={}) as connection:
            found[namespace] = await recorded_job_uid_on(
                connection, run_id=run_id, task_key="a", attempt=1
            )

    assert found == {NAMESPACE: "uid-a", "team-b": None}
