"""``compensateOn: Attempted`` through the engine: the outcome of a failed Job (its Pod's
exit code, or none) decides whether the attempted task is undone, and the compensator's Job
is told why it runs."""

from __future__ import annotations

from typing import Any

from flowforge.domain.states import CompensationState, RunPhase
from flowforge.domain.undo import UNDO_OF_ENV
from tests.engine.conftest import Harness

PAYMENT: list[dict[str, Any]] = [
    {"key": "reserve"},
    {"key": "charge", "dependsOn": ["reserve"]},
    {"key": "unreserve", "compensateFor": "reserve"},
    {"key": "refund", "compensateFor": "charge", "compensateOn": "Attempted"},
]


def _undo_of(harness: Harness, task_key: str) -> str:
    job = next(job for (_, name), job in harness.kube.jobs.items() if f"-c-{task_key}-1-" in name)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    return next(entry["value"] for entry in env if entry["name"] == UNDO_OF_ENV)


async def _fail_charge(harness: Harness, name: str, *, exit_code: int | None) -> Any:
    run = await harness.start(name, PAYMENT)
    await harness.finish("reserve")
    job = harness.kube.finish(harness.job_of("charge"), succeeded=False, exit_code=exit_code)
    await harness.engine.on_job_event(job, "MODIFIED")
    await harness.settle_background()
    return run


async def test_a_task_whose_container_exited_is_undone_first_and_told_so(
    harness: Harness,
) -> None:
    run = await _fail_charge(harness, "charged", exit_code=1)

    assert harness.roles_created()[-1] == ("compensation", "refund")
    assert _undo_of(harness, "refund") == "attempted"
    job = harness.kube.finish(harness.job_of("refund"), succeeded=True)
    await harness.engine.on_job_event(job, "MODIFIED")
    await harness.settle_background()
    assert harness.roles_created()[-1] == ("compensation", "unreserve")
    assert _undo_of(harness, "unreserve") == "succeeded"
    await harness.finish("unreserve")
    assert (await harness.run(run)).phase is RunPhase.FAILED


async def test_a_failed_job_whose_pods_tell_no_exit_code_is_not_undone(
    harness: Harness,
) -> None:
    run = await _fail_charge(harness, "unknown", exit_code=None)

    assert [key for role, key in harness.roles_created() if role == "compensation"] == ["unreserve"]
    await harness.finish("unreserve")
    assert (await harness.states(run))["refund"] == CompensationState.SKIPPED
    assert (await harness.run(run)).phase is RunPhase.FAILED
