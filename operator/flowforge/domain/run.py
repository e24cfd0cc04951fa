"""The WorkflowRun resource's spec and status, as pydantic models and JSON Schemas.

The spec is what a user asks for (which workflow, which version, parameters,
cancellation). The status is a projection of the run's rows in PostgreSQL, written
for humans and tools; it is bounded (at most MAX_TASK_SUMMARIES tasks listed) and
never the system of record. Field names are camelCase on the wire, as Kubernetes
resources expect; the pydantic attributes are snake_case.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from flowforge.domain.api import FINALIZER, FORCE_DELETE_ANNOTATION
from flowforge.domain.caps import (
    MAX_PARAMETER_VALUE_LENGTH,
    MAX_PARAMETERS,
    MAX_PARAMETERS_TOTAL_LENGTH,
)
from flowforge.domain.states import (
    CompensationState,
    RunPhase,
    ShownTaskState,
    TaskRole,
    TaskState,
)

MAX_TASK_SUMMARIES = 100
MAX_COMPENSATION_STEPS = 100
MAX_CONDITIONS = 16
MAX_PRIORITY = 1_000_000
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# a WorkflowRun's metadata.name: a DNS-1123 subdomain
RUN_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# a commit, a release, a date: letters, digits and - _ . : / inside, alphanumeric at both ends
IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.:/]*[A-Za-z0-9])?$"


# a parameter's value: any JSON (its definition's declarations say which)
_ANY_JSON_VALUE: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}


class _WireModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class RunSpec(_WireModel):
    """What a user asks for: one execution of a published workflow definition."""

    workflow: str = Field(
        min_length=1,
        max_length=63,
        pattern=NAME_PATTERN,
        description="Name of the workflow to run (the `spec.workflow` of a WorkflowDefinition). "
        "Cannot change after creation.",
    )
    version: int | None = Field(
        default=None,
        ge=1,
        description="Version of the workflow definition to run. When omitted at creation, the "
        "latest published version is filled in. Cannot change once set.",
    )
    parameters: dict[str, Annotated[Any, WithJsonSchema(_ANY_JSON_VALUE)]] = Field(
        default_factory=dict,
        max_length=MAX_PARAMETERS,
        description="Run parameters handed to every task: JSON values of the parameters the "
        "definition declares in its spec.parameters (checked against their types when the "
        "run is applied; the run records them with the defaults filled in), else string "
        f"values (at most {MAX_PARAMETERS}, {MAX_PARAMETER_VALUE_LENGTH} characters each "
        f"as JSON and {MAX_PARAMETERS_TOTAL_LENGTH} in total; no two names may map to the "
        "same FLOWFORGE_PARAM_<NAME> variable, as `a-b` and `a_b` would).",
    )
    retry_of: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=RUN_NAME_PATTERN,
        description="Name of a finished, unsuccessful (Failed or Cancelled) run in the same "
        "namespace that this run retries, with identical parameters: the tasks of that run "
        "whose work still stands are reused instead of run again. Checked at creation; "
        "cannot change after creation.",
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="Executes the workflow at most once per key in the namespace: a run whose "
        "key matches an earlier run there (one not yet pruned from the history) does not "
        "execute; it is that run's duplicate (status.duplicateOf) and shows its result, "
        "waiting for it when it has not finished. A retry (spec.retryOf) always executes. "
        "For a run kept in git, so that re-creating it (a self-heal) does not run it again. "
        "Cannot change after creation.",
    )
    cancel: bool = Field(
        default=False,
        description="Set to true to cancel the run: no new task starts, running tasks are "
        "stopped and the compensators of succeeded tasks run in reverse dependency order.",
    )
    priority: int = Field(
        default=0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="Where the run waits while a limit queues it: higher first, first come "
        "first served within one priority. Cannot change after creation.",
    )
    max_parallel_tasks: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="At most this many tasks of the run at once; may only lower the "
        "definition's spec.maxParallelTasks (the namespace's FlowForgePolicy caps both). "
        "Cannot change after creation.",
    )


# Kubernetes' own finalizer of a foreground deletion: the garbage collector deletes the run's
# Jobs before the run, so no compensator could run any more.
FOREGROUND_DELETION = "foregroundDeletion"


def deletion_forced(metadata: Mapping[str, Any]) -> bool:
    """The run's deletion skips the rollback: the escape annotation, or a foreground
    deletion (its Jobs are deleted first)."""
    annotations = metadata.get("annotations") or {}
    finalizers = metadata.get("finalizers") or []
    return (
        str(annotations.get(FORCE_DELETE_ANNOTATION, "")).lower() == "true"
        or FOREGROUND_DELETION in finalizers
    )


def deletion_waits_for_rollback(metadata: Mapping[str, Any]) -> bool:
    """A run being deleted stays (with its Jobs) until its rollback has settled: FlowForge's
    finalizer holds it and nobody forced the deletion."""
    return FINALIZER in (metadata.get("finalizers") or []) and not deletion_forced(metadata)


def run_gone(body: Mapping[str, Any] | None, *, uid: str) -> bool:
    """Whether the run's WorkflowRun object is gone for the engine: deleted, replaced by
    another object of the same name, or being deleted without waiting for its rollback. The
    garbage collector then removes the run's Jobs, compensators' included, so a Job of the
    run that vanishes is not a lost attempt: the run is cancelled, with no rollback."""
    if body is None or body["metadata"].get("uid") != uid:
        return True
    metadata = body["metadata"]
    return bool(metadata.get("deletionTimestamp")) and not deletion_waits_for_rollback(metadata)


# the reason of a refused run's conditions (a run the store never took)
DEFINITION_REFUSED = "DefinitionRefused"
CONCURRENCY_FORBIDDEN = "ConcurrencyForbidden"


def refused_for_good(body: Mapping[str, Any]) -> bool:
    """Its status shows that the operator refused it because its ``Forbid`` workflow's key
    was full: it stays refused (it may not start once the other run has finished)."""
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("reason") == CONCURRENCY_FORBIDDEN for c in conditions
    )


def shown_phase(body: Mapping[str, Any]) -> str | None:
    """The phase a WorkflowRun object's status shows (None: no status written yet)."""
    phase = (body.get("status") or {}).get("phase")
    return None if phase is None else str(phase)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_WireModel):
    """One observation about the run, in the shape of Kubernetes' metav1.Condition."""

    type: str = Field(
        min_length=1, max_length=316, description="Kind of observation, e.g. Ready or Compensating."
    )
    status: ConditionStatus = Field(
        description="Whether the condition holds: True, False or Unknown."
    )
    reason: str = Field(
        default="",
        max_length=1024,
        description="One CamelCase word a program can match on, explaining the last transition.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable detail about the last transition."
    )
    last_transition_time: datetime | None = Field(
        default=None, description="When the condition last changed status (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the condition was computed from."
    )


class RunProgress(_WireModel):
    """How many forward tasks of the run are in each state."""

    total: int = Field(default=0, ge=0, description="Number of forward tasks in the run.")
    waiting: int = Field(default=0, ge=0, description="Tasks waiting for their dependencies.")
    ready: int = Field(default=0, ge=0, description="Tasks released and about to start.")
    admitting: int = Field(
        default=0, ge=0, description="Tasks whose Job waits for Kueue's admission (suspended)."
    )
    running: int = Field(default=0, ge=0, description="Tasks whose Job is running.")
    succeeded: int = Field(default=0, ge=0, description="Tasks that succeeded.")
    failed: int = Field(default=0, ge=0, description="Tasks that failed after their retries.")
    tolerated: int = Field(
        default=0,
        ge=0,
        description="forEach items that failed within their task's tolerateFailures (not in "
        "failed): no failure of the run, their dependents ran.",
    )
    skipped: int = Field(
        default=0, ge=0, description="Tasks never started because an upstream task failed."
    )
    condition_skipped: int = Field(
        default=0,
        ge=0,
        description="Tasks not run because their when condition is false (reason "
        "ConditionFalse); their dependents ran as if they had succeeded.",
    )
    cancelled: int = Field(default=0, ge=0, description="Tasks stopped by a cancel request.")


class TaskSummary(_WireModel):
    """The state of one forward task, as last observed."""

    name: str = Field(min_length=1, description="The task's key in the workflow definition.")
    state: ShownTaskState = Field(
        description="The task's state; admitting while its Job waits for Kueue's admission."
    )
    attempt: int = Field(
        default=0, ge=0, description="Attempt number of the latest try (0 before the first try)."
    )
    job_name: str | None = Field(
        default=None, description="Name of the Job running the latest attempt, if any."
    )
    exit_code: int | None = Field(
        default=None, description="Container exit code of the latest finished attempt."
    )
    message: str = Field(
        default="", max_length=1024, description="Short explanation of the state, e.g. an error."
    )
    started_at: datetime | None = Field(
        default=None, description="When the first attempt started (RFC 3339)."
    )
    finished_at: datetime | None = Field(
        default=None, description="When the task reached its final state (RFC 3339)."
    )


class CompensationStep(_WireModel):
    """One compensator of the rollback and its state."""

    name: str = Field(min_length=1, description="The compensator's key in the workflow definition.")
    compensates: str = Field(
        min_length=1, description="Key of the succeeded forward task this compensator undoes."
    )
    role: TaskRole = Field(
        default=TaskRole.COMPENSATION, description="Always `compensation` for a rollback step."
    )
    state: CompensationState = Field(description="The compensator's state.")
    attempt: int = Field(default=0, ge=0, description="Attempt number of the latest try.")
    message: str = Field(
        default="", max_length=1024, description="Short explanation of the state, e.g. an error."
    )


class CompensationSummary(_WireModel):
    """Progress of the saga rollback, present once a task of the run has failed for good."""

    active: bool = Field(
        default=False, description="True while compensators are pending or running."
    )
    current: str | None = Field(
        default=None, description="Key of the compensator running now, if any."
    )
    steps: list[CompensationStep] = Field(
        default_factory=list,
        max_length=MAX_COMPENSATION_STEPS,
        description="Compensators in the order the rollback runs them (reverse dependency "
        f"order); at most {MAX_COMPENSATION_STEPS} are listed.",
    )


class FinalStep(_WireModel):
    """One ``finally`` task and its state."""

    name: str = Field(min_length=1, description="The finally task's key.")
    state: TaskState = Field(description="Its state: waiting, running, succeeded, failed...")
    attempt: int = Field(default=0, ge=0, description="Attempt number of the latest try.")
    message: str = Field(
        default="", max_length=1024, description="Short explanation of the state, e.g. an error."
    )


class FinallySummary(_WireModel):
    """The ``finally`` tasks, once the run's outcome is decided."""

    outcome: RunPhase = Field(description="The decided phase the finally tasks were told.")
    rollback: str = Field(
        description="How the rollback ended, as they were told: None, Completed or Halted."
    )
    steps: list[FinalStep] = Field(
        default_factory=list, max_length=16, description="The finally tasks, in list order."
    )


class QueueStatus(_WireModel):
    """Why a queued run waits, and where."""

    reason: str = Field(
        max_length=64,
        description="The limit that holds it: WorkflowConcurrency, NamespaceRunLimit, "
        "Replacing (an older run of its key is being cancelled for it) or IdempotencyKey (a "
        "duplicate waiting for the result of the run with the same spec.idempotencyKey).",
    )
    position: int = Field(
        ge=1, description="1 for the run that starts next among the namespace's queued runs."
    )
    message: str = Field(default="", max_length=1024, description="The limit, spelled out.")


class DuplicateOf(_WireModel):
    """The run whose result a duplicate shows (the same spec.idempotencyKey)."""

    name: str = Field(max_length=253, description="The original run's name.")
    uid: str = Field(max_length=64, description="The original run's metadata.uid.")
    phase: RunPhase = Field(description="The original run's phase when last projected.")


class RunStatus(_WireModel):
    """The observed state of a run, projected from its rows in PostgreSQL."""

    phase: RunPhase | None = Field(
        default=None,
        description="Lifecycle phase: pending, queued (a limit holds it), running, succeeded, "
        "failed or cancelled. A run "
        "that is rolling back stays running until every triggered compensator has settled.",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status reflects."
    )
    started_at: datetime | None = Field(
        default=None, description="When the run started executing (RFC 3339)."
    )
    finished_at: datetime | None = Field(
        default=None, description="When the run reached a final phase (RFC 3339)."
    )
    definition_fingerprint: str | None = Field(
        default=None,
        description="SHA-256 fingerprint of the definition version the run executes.",
    )
    progress: str | None = Field(
        default=None,
        description="Succeeded over total forward tasks, e.g. `3/4`, as shown by kubectl get.",
    )
    counts: RunProgress | None = Field(
        default=None, description="Number of forward tasks in each state."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Latest observations of the run's state, one per condition type.",
    )
    tasks: list[TaskSummary] = Field(
        default_factory=list,
        max_length=MAX_TASK_SUMMARIES,
        description=f"Per-task summary of at most {MAX_TASK_SUMMARIES} forward tasks; "
        "tasksTruncated tells when the run has more (the database holds every task).",
    )
    tasks_truncated: bool = Field(
        default=False, description="True when the run has more tasks than the summary may list."
    )
    compensation: CompensationSummary | None = Field(
        default=None, description="Progress of the saga rollback, once one is triggered."
    )
    finally_: FinallySummary | None = Field(
        default=None,
        alias="finally",
        description="The finally tasks, once the outcome is decided (spec.finally).",
    )
    queue: QueueStatus | None = Field(
        default=None, description="Present while the run is Queued: the limit and its position."
    )
    duplicate_of: DuplicateOf | None = Field(
        default=None,
        description="Present when the run did not execute because an earlier run of the "
        "namespace has the same spec.idempotencyKey: that run, whose result this one shows.",
    )
    message: str = Field(
        default="", max_length=4096, description="Human-readable explanation of the phase."
    )


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(by_alias=True, mode="validation")


RUN_SPEC_SCHEMA: dict[str, Any] = _schema(RunSpec)
RUN_STATUS_SCHEMA: dict[str, Any] = _schema(RunStatus)
