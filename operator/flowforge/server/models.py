"""The shapes of the read API (``docs/api.md``), as pydantic models: the responses are
serialised from them and the OpenAPI document at ``/api/v1/openapi.json`` is generated from
them. Field names are camelCase on the wire; fields are only ever added, never renamed."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from flowforge.domain.run_actions import MAX_REASON_LENGTH, RunActionKind


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class ErrorBody(ApiModel):
    code: int
    reason: Literal[
        "Unauthorized", "Forbidden", "NotFound", "BadRequest", "Conflict", "Unavailable"
    ]
    message: str


class ErrorResponse(ApiModel):
    error: ErrorBody


class WhoAmI(ApiModel):
    username: str
    groups: list[str]


class NamespaceItem(ApiModel):
    name: str


class NamespaceList(ApiModel):
    items: list[NamespaceItem]
    continue_: str | None = Field(alias="continue")


class QueueInfo(ApiModel):
    reason: str | None = None
    message: str | None = None
    position: int | None = None


class Progress(ApiModel):
    total: int
    succeeded: int
    failed: int
    running: int
    waiting: int
    skipped: int
    cancelled: int
    # released, not yet dispatched (counted in none of the above)
    ready: int = 0
    # forEach items that failed within their task's tolerateFailures (not in ``failed``)
    tolerated: int = 0


class RunSummary(ApiModel):
    namespace: str
    name: str
    uid: str
    workflow: str
    version: int
    phase: str
    compensating: bool
    cancel_requested: bool = False
    queue: QueueInfo | None = None
    progress: Progress
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    duration_seconds: float | None


class RunList(ApiModel):
    items: list[RunSummary]
    continue_: str | None = Field(alias="continue")


class Condition(ApiModel):
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: datetime | None


class CompensatorBrief(ApiModel):
    name: str
    state: str
    type: str


class Outcome(ApiModel):
    """How an attempt ended (of a task, the latest one's), and when it ran."""

    exit_code: int | None
    reason: str | None
    message: str | None = None
    started_at: datetime | None
    finished_at: datetime | None
    duration_seconds: float | None


class TaskBrief(Outcome):
    """A task of the run's DAG, or one item of a ``forEach`` task (``deploy[eu]``). A
    skipped task's ``reason`` says why when it was decided at creation (``ConditionFalse``,
    ``NoItems``); a task skipped because an upstream task failed has none."""

    name: str
    type: str
    state: str
    depends_on: list[str]
    level: int
    attempts: int
    compensator: CompensatorBrief | None
    # an item: the forEach task it is one instance of (the graph's node), and its item key
    for_each: str | None = None
    item: str | None = None


class Attempt(Outcome):
    number: int
    job_name: str | None
    state: str


class TaskDetail(TaskBrief):
    attempt_history: list[Attempt]
    compensator_attempts: list[Attempt]


class CompensationStep(ApiModel):
    order: int
    task: str
    compensator: str
    state: str
    started_at: datetime | None
    finished_at: datetime | None


class Compensation(ApiModel):
    state: Literal["NotTriggered", "Running", "Completed", "Halted"]
    halted_by: str | None
    triggered_by: str | None
    steps: list[CompensationStep]


class HistoryEntry(ApiModel):
    at: datetime
    kind: str
    task: str | None
    message: str


class Actor(ApiModel):
    username: str
    groups: list[str]


class RunAction(ApiModel):
    """A WorkflowRunAction as the run's history recorded it when the operator processed it."""

    name: str
    action: str
    actor: Actor | None
    # the gate (Approve, Reject) or the compensator (RetryCompensator, SkipCompensator)
    task: str | None
    compensator: str | None
    reason: str
    result: Literal["Accepted", "Refused"]
    message: str
    at: datetime


class RunActionList(ApiModel):
    items: list[RunAction]


class FinalStep(Outcome):
    """A ``finally`` task: its state, attempts and what its last attempt said."""

    name: str
    type: str
    state: str
    attempts: int
    attempt_history: list[Attempt]


class Finally(ApiModel):
    """The run's ``finally`` tasks (``docs/finally.md``), in the order they run."""

    # the decided phase they are told (FLOWFORGE_RUN_OUTCOME); None until it is decided
    outcome: Literal["Succeeded", "Failed", "Cancelled"] | None
    # how the rollback ended, as they are told (FLOWFORGE_ROLLBACK)
    rollback: Literal["None", "Completed", "Halted"] | None
    # they run now: the run takes the outcome once the last has run
    finalizing: bool
    steps: list[FinalStep]


class RunDetail(RunSummary):
    parameters: dict[str, Any]
    retry_of: str | None
    conditions: list[Condition]
    tasks: list[TaskBrief]
    tasks_omitted: bool = False
    compensation: Compensation
    events: list[HistoryEntry]
    # a person's Pause holds it (nothing starts until Resume)
    paused: bool = False
    actions: list[RunAction] = []
    # None: the run has no finally tasks
    finally_: Finally | None = Field(default=None, alias="finally")


class GraphNode(ApiModel):
    id: str
    type: str
    state: str | None
    level: int
    # a forEach task: one node for all its items, whose states are keyed ``<id>[<item key>]``
    # (the stream's, the detail's tasks); sent only when true
    for_each: bool = False
    # why a skipped node was skipped when the run was created (``ConditionFalse``,
    # ``NoItems``); sent only then
    reason: str | None = None


class GraphCompensator(ApiModel):
    id: str
    task: str
    type: str
    state: str | None


class Graph(ApiModel):
    nodes: list[GraphNode]
    edges: list[tuple[str, str]]
    # compensator ids in the order the rollback runs (ran) them
    rollback: list[str]
    levels: int
    compensators: list[GraphCompensator] = []
    workflow: str | None = None
    version: int | None = None


class RunWithConditions(RunSummary):
    conditions: list[Condition]


class RunChange(ApiModel):
    run: RunWithConditions
    states: dict[str, str]
    compensation: Compensation


class RunReference(ApiModel):
    namespace: str
    name: str


class ActionRequest(ApiModel):
    """A WorkflowRunAction's spec without ``run`` (the path names it)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid"
    )

    action: RunActionKind
    task: str | None = Field(default=None, max_length=63)
    compensator: str | None = Field(default=None, max_length=63)
    reason: str | None = Field(default=None, max_length=MAX_REASON_LENGTH)


class ActionReference(ApiModel):
    """The WorkflowRunAction created: the operator processes it, then the run's history
    (and its ``actions``) shows the result."""

    namespace: str
    name: str
    run: str


class DefinitionVersionBrief(ApiModel):
    version: int
    fingerprint: str
    published_at: datetime
    tasks: int


class DefinitionSummary(ApiModel):
    namespace: str
    name: str
    versions: list[DefinitionVersionBrief]


class DefinitionList(ApiModel):
    items: list[DefinitionSummary]


class TaskTypeBrief(ApiModel):
    image: str
    command: list[str] | None
    args: list[str] | None


class DefinitionVersionHead(ApiModel):
    """A ``DefinitionVersion`` up to its graph, whose JSON the server writes in itself
    (``graphs.py``, ``definitions.py``)."""

    version: int
    fingerprint: str
    published_at: datetime
    task_types: dict[str, TaskTypeBrief]


class DefinitionVersion(DefinitionVersionHead):
    graph: Graph


class DefinitionDetail(ApiModel):
    namespace: str
    name: str
    versions: list[DefinitionVersion]


class LastFire(ApiModel):
    nominal_time: datetime
    run: str
    # None: the store does not hold the run (yet)
    phase: str | None


class ScheduleSummary(ApiModel):
    """A WorkflowSchedule: its spec and next times from the object (read with the caller's
    token), what it fired from the store."""

    namespace: str
    name: str
    uid: str
    workflow: str
    version: int | None
    schedule: str
    time_zone: str
    suspended: bool
    overlap_policy: str
    next_fire_times: list[datetime]
    conditions: list[Condition]
    created_at: datetime | None
    last_fire: LastFire | None
    active: list[str]
    missed: dict[str, int]
    queued: datetime | None


class ScheduleList(ApiModel):
    items: list[ScheduleSummary]


class ScheduledRun(ApiModel):
    nominal_time: datetime
    name: str
    backfill: str | None
    manual: bool
    fired_at: datetime
    # None: the store does not hold the run (not created yet, or deleted and pruned)
    run: RunSummary | None


class ScheduleDetail(ScheduleSummary):
    runs: list[ScheduledRun]
    continue_: str | None = Field(alias="continue")
