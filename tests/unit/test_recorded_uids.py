"""The launcher's memory of the Job uids it recorded: trusted only under the epoch that
recorded them, forgotten with the attempt, and bounded."""

from __future__ import annotations

import asyncio

import pytest

from flowforge.domain.states import TaskRole
from flowforge.kube.jobs import JobIdentity
from flowforge.operator import launcher
from flowforge.operator.launcher import RecordedUids


def test_a_uid_counts_only_under_the_epoch_that_recorded_it() -> None:
    uids = RecordedUids()
    uids.remember(epoch=3, run_id=1, task_key="a", attempt=1, uid="u-1")

    assert uids.lookup(epoch=3, run_id=1, task_key="a", attempt=1) == "u-1"
    # a new leader may have recorded another Job since: the store is asked again
    assert uids.lookup(epoch=4, run_id=1, task_key="a", attempt=1) is None
    assert uids.lookup(epoch=3, run_id=1, task_key="a", attempt=2) is None
    assert uids.lookup(epoch=3, run_id=2, task_key="a", attempt=1) is None


def test_the_newest_record_of_an_attempt_wins_and_an_outcome_forgets_it() -> None:
    uids = RecordedUids()
    uids.remember(epoch=1, run_id=1, task_key="a", attempt=1, uid="old")
    uids.remember(epoch=1, run_id=1, task_key="a", attempt=1, uid="new")
    assert uids.lookup(epoch=1, run_id=1, task_key="a", attempt=1) == "new"

    uids.forget(run_id=1, task_key="a", attempt=1)
    uids.forget(run_id=1, task_key="a", attempt=1)  # twice is harmless
    assert uids.lookup(epoch=1, run_id=1, task_key="a", attempt=1) is None
    assert len(uids) == 0


def test_the_oldest_runs_go_first_beyond_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_REMEMBERED_UIDS", 3)
    uids = RecordedUids()
    for run_id in range(1, 6):
        uids.remember(epoch=1, run_id=run_id, task_key="a", attempt=1, uid=f"u-{run_id}")

    assert len(uids) == 3
    assert uids.lookup(epoch=1, run_id=2, task_key="a", attempt=1) is None
    assert [uids.lookup(epoch=1, run_id=n, task_key="a", attempt=1) for n in (3, 4, 5)] == [
        "u-3",
        "u-4",
        "u-5",
    ]


def test_a_finished_run_forgets_every_attempt_it_left() -> None:
    uids = RecordedUids()
    for attempt in (1, 2):
        uids.remember(epoch=1, run_id=7, task_key="a", attempt=attempt, uid=f"u-{attempt}")
    uids.remember(epoch=1, run_id=8, task_key="a", attempt=1, uid="other")

    uids.forget_run(7)
    uids.forget_run(7)
    assert len(uids) == 1
    assert uids.lookup(epoch=1, run_id=7, task_key="a", attempt=1) is None
    assert uids.lookup(epoch=1, run_id=8, task_key="a", attempt=1) == "other"


async def test_a_job_is_found_by_its_uid_once_its_record_is_stored() -> None:
    uids = RecordedUids()
    job = JobIdentity(
        namespace="ns",
        name="r-a-1-x",
        run_uid="run",
        task_key="a",
        attempt=1,
        role=TaskRole.FORWARD,
        uid="u-1",
    )
    uids.expect("u-1")  # created; the store write is in flight
    looking = asyncio.create_task(uids.recorded(epoch=1, uid="u-1"))
    await asyncio.sleep(0)
    assert not looking.done()

    uids.remember(epoch=1, run_id=7, task_key="a", attempt=1, uid="u-1", job=job)
    uids.settled("u-1")
    assert await looking == (7, job)
    assert await uids.recorded(epoch=2, uid="u-1") is None  # another leader's epoch
    assert uids.named(namespace="ns", name="r-a-1-x") == "u-1"

    uids.forget(run_id=7, task_key="a", attempt=1)
    assert await uids.recorded(epoch=1, uid="u-1") is None
    assert uids.named(namespace="ns", name="r-a-1-x") is None


async def test_a_record_that_failed_leaves_the_job_unknown() -> None:
    uids = RecordedUids()
    uids.expect("u-1")
    looking = asyncio.create_task(uids.recorded(epoch=1, uid="u-1"))
    await asyncio.sleep(0)
    uids.settled("u-1")  # the write raised: nothing remembered
    assert await looking is None
