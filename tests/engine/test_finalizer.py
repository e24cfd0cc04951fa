"""The WorkflowRun finalizer with the fake Kubernetes: a deleted run stays until its rollback
has settled, the escape annotation forces it, and the reconciler finishes a stuck deletion."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.api import FINALIZER, FORCE_DELETE_ANNOTATION
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.operator.finalizer import observe_run
from flowforge.operator.runs import RunContext
from tests.engine.conftest import NAMESPACE, Harness
from tests.support.workflows import SAGA

pytestmark = pytest.mark.store


def body(harness: Harness, name: str) -> dict[str, Any] | None:
    return harness.kube.runs.get((NAMESPACE, name))


async def started(harness: Harness, name: str) -> RunContext:
    run = await harness.start(name, SAGA)
    current = body(harness, name)
    assert current is not None
    await observe_run(harness.engine, current)
    return run


async def delete(harness: Harness, name: str, **annotations: str) -> None:
    """What ``kubectl delete`` does to an object a finalizer holds, then its watch event."""
    current = body(harness, name)
    assert current is not None and FINALIZER in current["metadata"]["finalizers"]
    current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    current["metadata"].setdefault("annotations", {}).update(annotations)
    await observe_run(harness.engine, current)
    await harness.settle_background()


async def test_the_operator_adds_its_finalizer_once_the_run_s_rows_exist(
    harness: Harness,
) -> None:
    await started(harness, "held")
    current = body(harness, "held")
    assert current is not None
    assert current["metadata"]["finalizers"] == [FINALIZER]
    await observe_run(harness.engine, current)  # seen again: not added twice
    assert current["metadata"]["finalizers"] == [FINALIZER]


async def test_a_run_without_compensators_gets_no_finalizer_and_its_deletion_cancels_it(
    harness: Harness,
) -> None:
    """Nothing to roll back, nothing to wait for: no finalizer patch (one write less per
    run); the object goes at once and its DELETED event cancels the run in the store."""
    run = await harness.start("plain", [{"key": "a"}, {"key": "b", "dependsOn": ["a"]}])
    current = body(harness, "plain")
    assert current is not None
    await observe_run(harness.engine, current)
    assert "finalizers" not in current["metadata"]

    await harness.engine.run_deleted(current)
    await harness.settle_background()

    record = await harness.run(run)
    assert record.phase is RunPhase.CANCELLED
    assert (await harness.states(run))["b"] == TaskState.CANCELLED


async def test_a_run_deleted_mid_run_rolls_back_before_its_object_goes(harness: Harness) -> None:
    run = await started(harness, "mid")
    await harness.finish("reserve")
    await harness.finish("charge")
    ship = harness.job_of("ship")
    stopped = harness.kube.jobs[(NAMESPACE, ship)]

    await delete(harness, "mid")

    assert (NAMESPACE, ship) not in harness.kube.jobs  # the running forward task is stopped
    # its Job's deletion comes back as an event: not taken for the run being gone
    await harness.engine.on_job_event(stopped, "DELETED")
    assert harness.kube.active() == [harness.job_of("refund")]
    assert body(harness, "mid") is not None  # still held
    await harness.finish("refund")
    current = body(harness, "mid")
    assert current is not None
    await observe_run(harness.engine, current)
    assert body(harness, "mid") is not None  # release has not run yet
    await harness.finish("release")
    current = body(harness, "mid")
    assert current is not None
    await observe_run(harness.engine, current)

    assert body(harness, "mid") is None  # the finalizer is gone: so is the object
    record = await harness.run(run)
    assert record.phase is RunPhase.CANCELLED
    states = await harness.states(run)
    assert states["ship"] == TaskState.CANCELLED
    assert states["refund"] == states["release"] == CompensationState.SUCCEEDED


async def test_the_escape_annotation_skips_the_rollback_and_lets_the_object_go(
    harness: Harness,
) -> None:
    run = await started(harness, "forced")
    await harness.finish("reserve")

    await delete(harness, "forced", **{FORCE_DELETE_ANNOTATION: "true"})

    assert body(harness, "forced") is None
    assert (await harness.run(run)).phase is RunPhase.CANCELLED
    states = await harness.states(run)
    assert states["release"] == states["refund"] == CompensationState.SKIPPED
    assert not harness.kube.active()


async def test_the_reconciler_finishes_a_deletion_left_stuck(harness: Harness) -> None:
    run = await started(harness, "stuck")
    await harness.finish("reserve")
    await harness.finish("charge")
    await harness.finish("ship", succeeded=False)
    await harness.finish("refund")
    current = body(harness, "stuck")
    assert current is not None
    # deleted while the operator was down, after the rollback's last outcome was recorded
    current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await harness.finish("release")
    assert (await harness.run(run)).phase is RunPhase.FAILED
    assert body(harness, "stuck") is not None

    await harness.reconciler.pass_once()

    assert body(harness, "stuck") is None
