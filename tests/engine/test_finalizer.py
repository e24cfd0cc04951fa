"""The WorkflowRun finalizer with the fake Kubernetes: a deleted run stays until its rollback
has settled, the escape annotation forces it, the reconciler finishes a stuck deletion, and a
namespace being deleted (where no Job can be made) ends the rollback at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from flowforge.domain.api import FINALIZER, FORCE_DELETE_ANNOTATION
from flowforge.domain.execution import BackoffPolicy
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.kube.errors import KubernetesError, from_client_error
from flowforge.operator.finalizer import observe_run
from flowforge.operator.runs import RunContext
from flowforge.store.connection import Pool
from flowforge.store.queries import latest_outcomes
from tests.engine.conftest import NAMESPACE, Harness, engine_settings, open_harness
from tests.engine.fake_clock import FakeClock
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


# what the apiserver's NamespaceLifecycle admission answers a creation in a namespace that is
# being deleted
TERMINATING = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'jobs.batch "x" is forbidden: unable to create new content in namespace '
    f"{NAMESPACE} because it is being terminated",
    "reason": "Forbidden",
    "details": {
        "name": "x",
        "group": "batch",
        "kind": "jobs",
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": f"namespace {NAMESPACE} is being terminated",
                "field": "metadata.namespace",
            }
        ],
    },
    "code": 403,
}


def namespace_terminating(_: Mapping[str, Any]) -> KubernetesError:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps(TERMINATING)
    return from_client_error(error)


@pytest.fixture
async def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def slow_retries(store: Pool, clock: FakeClock) -> AsyncIterator[Harness]:
    """Compensator retries a minute apart, doubling to an hour: ten of them take hours."""
    backoff = BackoffPolicy(first_delay_seconds=60, cap_seconds=3600, jitter=0.0)
    async with open_harness(store, settings=engine_settings(backoff=backoff), clock=clock) as h:
        yield h


async def test_a_namespace_being_deleted_halts_the_rollback_and_lets_the_run_go(
    slow_retries: Harness,
) -> None:
    """Deleting the namespace deletes the run: its rollback starts, and the apiserver refuses
    every compensator's Job (the namespace is terminating). The compensator fails for good
    (``NamespaceTerminating``, not retried), the rollback halts, the finalizer goes: the
    namespace is not held Terminating through hours of retries."""
    harness = slow_retries
    retried = [{**task, "retries": 10} if "compensateFor" in task else dict(task) for task in SAGA]
    run = await harness.start("doomed", retried)
    current = body(harness, "doomed")
    assert current is not None
    await observe_run(harness.engine, current)
    await harness.finish("reserve")
    await harness.finish("charge")
    harness.kube.create_error = namespace_terminating

    await delete(harness, "doomed")

    assert body(harness, "doomed") is None  # the finalizer went: no time had to pass
    assert (await harness.run(run)).phase is RunPhase.CANCELLED
    states = await harness.states(run)
    assert states["refund"] == CompensationState.FAILED
    assert states["release"] == CompensationState.SKIPPED
    outcome = (await latest_outcomes(harness.pool, run.run_id, ["refund"]))["refund"]
    assert outcome["reason"] == "NamespaceTerminating"
    assert "being terminated" in outcome["message"]
    reasons = harness.kube.reasons()
    assert "TaskRetrying" not in reasons
    halted = [event for event in harness.kube.events if event.reason == "CompensationFailed"]
    assert halted and "NamespaceTerminating" in halted[0].message
