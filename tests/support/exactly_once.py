"""Exactly once, however the operator or its database fails: diamond runs of one-second
steps, and the check that no Job was created twice, no attempt lost or repeated and every
outcome recorded once (``test_engine_crash.py``, ``test_postgres_faults.py``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from flowforge.store.events import run_history
from flowforge.store.runs import find_run
from tests.plugins.operator import JobCreationLog, RunDriver

STEP = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}


def diamond(workflow: str) -> dict[str, Any]:
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"step": STEP},
        "tasks": [
            {"key": "a", "type": "step"},
            {"key": "b", "type": "step", "dependsOn": ["a"]},
            {"key": "c", "type": "step", "dependsOn": ["a"]},
            {"key": "d", "type": "step", "dependsOn": ["b", "c"]},
        ],
    }


async def assert_exactly_once(driver: RunDriver, log: JobCreationLog, names: list[str]) -> None:
    """One Job object per (run, task, attempt) ever created, every outcome recorded once."""
    duplicates = {name: uids for name, uids in log.uids_by_name.items() if len(uids) > 1}
    assert not duplicates, f"Jobs created more than once: {duplicates}"
    per_attempt = Counter(
        (labels["flowforge.io/run"], labels["flowforge.io/task"], labels["flowforge.io/attempt"])
        for labels in log.labels_by_name.values()
    )
    assert all(count == 1 for count in per_attempt.values()), per_attempt
    assert len(per_attempt) == 4 * len(names)
    assert {attempt for _, _, attempt in per_attempt} == {"1"}, "an attempt was lost or repeated"
    for name in names:
        body = driver.run(name)
        run = await find_run(
            driver.pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
        )
        events = await run_history(driver.pool, run.id)
        outcomes = Counter((e.task_key, e.attempt) for e in events if e.kind == "task.succeeded")
        assert outcomes == {(key, 1): 1 for key in "abcd"}, (name, outcomes)
