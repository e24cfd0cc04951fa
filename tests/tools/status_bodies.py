"""The recorded status bodies under ``tests/data/status/``: WorkflowRun and
WorkflowDefinition objects of every phase, their status made by the operator's own code
(``flowforge.domain.projection``, ``flowforge.operator.publishing``) on a fixed clock.

The kstatus reader, the Argo CD health checks and actions (gopher-lua) and the Flux
``healthCheckExprs`` (CEL) are tested against these files, and ``EXPECTED`` says what each
must make of every one. Refresh them after a change of the projection with

    .venv/bin/python -m tests.tools.status_bodies

(``tests/unit/test_status_bodies.py`` fails while they are stale). The cluster test
``tests/cluster/test_kstatus.py`` checks the same verdicts on live objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from flowforge.domain.api import FINALIZER
from flowforge.domain.projection import StatusInput, TaskCounts, project_status, refused_status
from flowforge.domain.run import (
    CompensationStep,
    FinallySummary,
    FinalStep,
    QueueStatus,
    TaskSummary,
)
from flowforge.domain.states import CompensationState, RunPhase, ShownTaskState, TaskState
from flowforge.domain.validation import parse_definition
from flowforge.operator.publishing import PublishOutcome

DIRECTORY = Path(__file__).resolve().parents[1] / "data" / "status"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
STARTED = NOW - timedelta(minutes=3)
GROUP_VERSION = "flowforge.io/v1alpha1"
NAMESPACE = "shop"
FINGERPRINT = "sha256:" + "ab" * 32

ORDER_SPEC: dict[str, Any] = {
    "workflow": "order",
    "version": 1,
    "taskTypes": {"step": {"image": "busybox:1.36", "command": ["sh", "-c", "true"]}},
    "tasks": [
        {"key": "reserve", "type": "step"},
        {"key": "charge", "type": "step", "dependsOn": ["reserve"]},
        {"key": "ship", "type": "step", "dependsOn": ["charge"]},
        {"key": "release", "type": "step", "compensateFor": "reserve"},
        {"key": "refund", "type": "step", "compensateFor": "charge"},
    ],
}


class Verdict(NamedTuple):
    """What kstatus, Argo CD's health check and Flux's expressions make of one object."""

    kstatus: str
    argocd: str
    flux: str


EXPECTED: Mapping[str, Verdict] = {
    # no status yet: kstatus alone sees no condition and calls it Current (its documented
    # limit); Argo CD's check and Flux's expressions wait
    "run-pending": Verdict("Current", "Progressing", "InProgress"),
    "run-queued": Verdict("InProgress", "Suspended", "InProgress"),
    "run-running": Verdict("InProgress", "Progressing", "InProgress"),
    # a person holds it: an approval gate awaits, or it is paused (Argo CD: Suspended)
    "run-awaiting-approval": Verdict("InProgress", "Suspended", "InProgress"),
    "run-paused": Verdict("InProgress", "Suspended", "InProgress"),
    # its outcome is decided, its finally tasks run: not done yet
    "run-finalizing": Verdict("InProgress", "Progressing", "InProgress"),
    "run-admitting": Verdict("InProgress", "Progressing", "InProgress"),
    "run-compensating": Verdict("InProgress", "Progressing", "InProgress"),
    "run-cancelling": Verdict("InProgress", "Progressing", "InProgress"),
    "run-cancel-unobserved": Verdict("InProgress", "Progressing", "InProgress"),
    "run-succeeded": Verdict("Current", "Healthy", "Current"),
    "run-failed": Verdict("Failed", "Degraded", "Failed"),
    "run-failed-halted": Verdict("Failed", "Degraded", "Failed"),
    "run-cancelled": Verdict("Failed", "Degraded", "Failed"),
    "run-refused": Verdict("Failed", "Degraded", "Failed"),
    # Flux's expressions replace kstatus for the kind: a deletion reads as the phase does
    "run-deleting": Verdict("Terminating", "Progressing", "InProgress"),
    "definition-new": Verdict("Current", "Progressing", "InProgress"),
    "definition-published": Verdict("Current", "Healthy", "Current"),
    "definition-refused": Verdict("Failed", "Degraded", "Failed"),
}


def _metadata(name: str, *, generation: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": NAMESPACE,
        "uid": f"00000000-0000-4000-8000-{sum(map(ord, name)):012d}",
        "generation": generation,
        "creationTimestamp": "2026-11-30T11:57:00Z",
        **extra,
    }


def _run(name: str, status: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": GROUP_VERSION,
        "kind": "WorkflowRun",
        "metadata": _metadata(name, generation=2 if spec.get("cancel") else 1),
        "spec": {"workflow": "order", "version": 1, "parameters": {"orderId": "1001"}, **spec},
    }
    if status is not None:
        obj["status"] = status
    return obj


def _task(name: str, state: ShownTaskState, **extra: Any) -> TaskSummary:
    return TaskSummary(name=name, state=state, attempt=1 if state != "waiting" else 0, **extra)


def _step(name: str, compensates: str, state: CompensationState, **extra: Any) -> CompensationStep:
    attempt = 0 if state in (CompensationState.PENDING, CompensationState.SKIPPED) else 1
    return CompensationStep(
        name=name, compensates=compensates, state=state, attempt=attempt, **extra
    )


def _project(phase: RunPhase, counts: TaskCounts, *, generation: int = 1, **extra: Any) -> Any:
    final = phase in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED)
    return project_status(
        StatusInput(
            phase=phase,
            counts=counts,
            fingerprint=FINGERPRINT,
            started_at=STARTED,
            finished_at=NOW if final else None,
            now=NOW,
            observed_generation=generation,
            **extra,
        )
    )


def _runs() -> dict[str, dict[str, Any]]:
    waiting = ShownTaskState.WAITING
    failed_counts = TaskCounts(total=3, succeeded=2, failed=1)
    failed_tasks = [
        _task("reserve", ShownTaskState.SUCCEEDED),
        _task("charge", ShownTaskState.SUCCEEDED),
        _task("ship", ShownTaskState.FAILED, exit_code=3, message="exit code 3"),
    ]
    rolling_back = [
        _step("refund", "charge", CompensationState.SUCCEEDED),
        _step("release", "reserve", CompensationState.RUNNING),
    ]
    cancelling = {"cancel_requested": True}
    return {
        "run-pending": _run("order-pending", None),
        "run-queued": _run(
            "order-queued",
            _project(
                RunPhase.QUEUED,
                TaskCounts(total=3, waiting=3),
                tasks=[_task(k, waiting) for k in ("reserve", "charge", "ship")],
                queue=QueueStatus(
                    reason="NamespaceRunLimit",
                    position=1,
                    message="the namespace runs at most 1 run at once; 1st in line",
                ),
            ),
        ),
        "run-running": _run(
            "order-running",
            _project(
                RunPhase.RUNNING,
                TaskCounts(total=3, succeeded=1, running=1, waiting=1),
                tasks=[
                    _task("reserve", ShownTaskState.SUCCEEDED),
                    _task("charge", ShownTaskState.RUNNING),
                    _task("ship", waiting),
                ],
            ),
        ),
        "run-awaiting-approval": _run(
            "order-awaiting",
            _project(
                RunPhase.RUNNING,
                TaskCounts(total=3, succeeded=1, awaiting=1, waiting=1),
                tasks=[
                    _task("reserve", ShownTaskState.SUCCEEDED),
                    _task("charge", ShownTaskState.AWAITING),
                    _task("ship", waiting),
                ],
                awaiting_approval=[("charge", NOW - timedelta(minutes=1))],
            ),
        ),
        "run-paused": _run(
            "order-paused",
            _project(
                RunPhase.RUNNING,
                TaskCounts(total=3, succeeded=1, ready=1, waiting=1),
                tasks=[
                    _task("reserve", ShownTaskState.SUCCEEDED),
                    _task("charge", ShownTaskState.READY),
                    _task("ship", waiting),
                ],
                paused_at=NOW - timedelta(minutes=1),
            ),
        ),
        "run-finalizing": _run(
            "order-finalizing",
            _project(
                RunPhase.RUNNING,
                TaskCounts(total=3, succeeded=3),
                tasks=[_task(k, ShownTaskState.SUCCEEDED) for k in ("reserve", "charge", "ship")],
                final=FinallySummary(
                    outcome=RunPhase.SUCCEEDED,
                    rollback="None",
                    steps=[FinalStep(name="notify", state=TaskState.RUNNING, attempt=1)],
                ),
            ),
        ),
        "run-admitting": _run(
            "order-admitting",
            _project(
                RunPhase.RUNNING,
                TaskCounts(total=3, admitting=1, waiting=2),
                tasks=[
                    _task("reserve", ShownTaskState.ADMITTING),
                    _task("charge", waiting),
                    _task("ship", waiting),
                ],
            ),
        ),
        "run-compensating": _run(
            "order-compensating",
            _project(
                RunPhase.RUNNING,
                failed_counts,
                tasks=failed_tasks,
                failure_message="task ship failed: exit code 3",
                compensating=True,
                compensation=rolling_back,
            ),
        ),
        "run-cancelling": _run(
            "order-cancelling",
            _project(
                RunPhase.RUNNING,
                TaskCounts(total=3, succeeded=1, running=1, waiting=1),
                generation=2,
                **cancelling,
            ),
            cancel=True,
        ),
        # spec.cancel set, and the operator has not observed generation 2 yet
        "run-cancel-unobserved": _run(
            "order-cancel-unobserved",
            _project(RunPhase.RUNNING, TaskCounts(total=3, succeeded=1, running=1, waiting=1)),
            cancel=True,
        ),
        "run-succeeded": _run(
            "order-succeeded",
            _project(
                RunPhase.SUCCEEDED,
                TaskCounts(total=3, succeeded=3),
                tasks=[_task(k, ShownTaskState.SUCCEEDED) for k in ("reserve", "charge", "ship")],
            ),
        ),
        "run-failed": _run(
            "order-1001",
            _project(
                RunPhase.FAILED,
                failed_counts,
                tasks=failed_tasks,
                failure_message="task ship failed: exit code 3",
                compensation=[
                    _step("refund", "charge", CompensationState.SUCCEEDED),
                    _step("release", "reserve", CompensationState.SUCCEEDED),
                ],
                rollback_started_at=NOW - timedelta(minutes=1),
            ),
        ),
        "run-failed-halted": _run(
            "order-halted",
            _project(
                RunPhase.FAILED,
                failed_counts,
                tasks=failed_tasks,
                failure_message="task ship failed: exit code 3",
                compensation=[
                    _step("refund", "charge", CompensationState.FAILED, message="exit code 1"),
                    _step(
                        "release",
                        "reserve",
                        CompensationState.SKIPPED,
                        message="not run: the rollback halted",
                    ),
                ],
                rollback_started_at=NOW - timedelta(minutes=1),
                rollback_halted_at=NOW,
            ),
        ),
        "run-cancelled": _run(
            "order-cancelled",
            _project(
                RunPhase.CANCELLED,
                TaskCounts(total=3, succeeded=1, cancelled=2),
                generation=2,
                compensation=[
                    _step("release", "reserve", CompensationState.SUCCEEDED),
                ],
                rollback_started_at=NOW - timedelta(minutes=1),
                **cancelling,
            ),
            cancel=True,
        ),
        "run-refused": _run(
            "order-refused",
            refused_status(
                message="workflow order has no published version 7", now=NOW, generation=1
            ),
            version=7,
        ),
        "run-deleting": _deleting(
            _run(
                "order-deleting",
                _project(
                    RunPhase.RUNNING,
                    failed_counts,
                    tasks=failed_tasks,
                    compensating=True,
                    compensation=rolling_back,
                    **cancelling,
                ),
            )
        ),
    }


def _deleting(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["deletionTimestamp"] = "2026-11-30T11:59:30Z"
    obj["metadata"]["finalizers"] = [FINALIZER]
    return obj


def _definition(name: str, spec: dict[str, Any], status: dict[str, Any] | None) -> Any:
    obj: dict[str, Any] = {
        "apiVersion": GROUP_VERSION,
        "kind": "WorkflowDefinition",
        "metadata": _metadata(name),
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def _definitions() -> dict[str, dict[str, Any]]:
    published = PublishOutcome(definition=parse_definition(ORDER_SPEC), message="published")
    refused = PublishOutcome(
        definition=None,
        message="not published: version 1 of workflow order is published with other "
        "content; publish a new version",
    )
    return {
        "definition-new": _definition("order-v1", ORDER_SPEC, None),
        "definition-published": _definition("order-v1", ORDER_SPEC, _at_now(published, 1)),
        "definition-refused": _definition("order-v1-copy", ORDER_SPEC, _at_now(refused, 1)),
    }


def _at_now(outcome: PublishOutcome, generation: int) -> dict[str, Any]:
    stamp = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    status = outcome.status(generation)
    for condition in status["conditions"]:
        condition["lastTransitionTime"] = stamp  # the fixed clock, not the wall clock
    return status


def bodies() -> dict[str, dict[str, Any]]:
    """Every recorded object by its file's stem, made now by the operator's code."""
    return {**_runs(), **_definitions()}


def encode(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def recorded() -> dict[str, dict[str, Any]]:
    """The committed files, by stem."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(DIRECTORY.glob("*.json"))}


def main() -> None:
    DIRECTORY.mkdir(parents=True, exist_ok=True)
    for stale in DIRECTORY.glob("*.json"):
        stale.unlink()
    for stem, obj in bodies().items():
        (DIRECTORY / f"{stem}.json").write_text(encode(obj))
    print(f"wrote {len(EXPECTED)} objects to {DIRECTORY}")


if __name__ == "__main__":
    main()
