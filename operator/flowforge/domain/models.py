"""Typed, immutable models of a WorkflowDefinition's ``spec``.

Attributes are snake_case; the document's camelCase names are the aliases, so
``DefinitionSpec.model_validate(document)`` reads a spec and ``to_document()`` writes it back.
Build them through :func:`flowforge.domain.validation.parse_definition`, which checks shape
and graph first; the models themselves only hold data and derive views of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from flowforge.domain.fingerprint import fingerprint
from flowforge.domain.graph import DependencyGraph

_MODEL_CONFIG = ConfigDict(
    frozen=True,
    populate_by_name=True,
    alias_generator=to_camel,
    extra="forbid",
)


class EnvVar(BaseModel):
    """One environment variable of a task's container."""

    model_config = _MODEL_CONFIG

    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None


class ContainerTemplate(BaseModel):
    """The template of the Job that runs the tasks of one type."""

    model_config = _MODEL_CONFIG

    image: str
    command: tuple[str, ...] | None = None
    args: tuple[str, ...] | None = None
    env: tuple[EnvVar, ...] | None = None
    resources: dict[str, dict[str, int | str]] | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    service_account_name: str | None = None
    node_selector: dict[str, str] | None = None
    tolerations: tuple[dict[str, Any], ...] | None = None
    automount_service_account_token: bool | None = None
    pending_timeout_seconds: int | None = None
    # Kubernetes' own Pod and container fields (shapes in `podspec_schema`): held as the
    # documents they are, handed to the Job as they are.
    env_from: tuple[dict[str, Any], ...] | None = None
    volume_mounts: tuple[dict[str, Any], ...] | None = None
    image_pull_policy: str | None = None
    working_dir: str | None = None
    security_context: dict[str, Any] | None = None
    volumes: tuple[dict[str, Any], ...] | None = None
    image_pull_secrets: tuple[dict[str, Any], ...] | None = None
    affinity: dict[str, Any] | None = None
    topology_spread_constraints: tuple[dict[str, Any], ...] | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    pod_security_context: dict[str, Any] | None = None
    init_containers: tuple[dict[str, Any], ...] | None = None
    host_network: bool | None = None
    host_pid: bool | None = Field(default=None, alias="hostPID")
    host_ipc: bool | None = Field(default=None, alias="hostIPC")
    job_metadata: dict[str, dict[str, str]] | None = None
    # Kueue: the LocalQueue the Jobs queue in (created suspended, Kueue admits them)
    queue_name: str | None = None
    workload_priority_class: str | None = None
    admission_timeout_seconds: int | None = None


class ForEachSpec(BaseModel):
    """A task's ``forEach``: one instance of the task per item (`flowforge.domain.for_each`)."""

    model_config = _MODEL_CONFIG

    # a CEL expression over ``params`` that gives a list, or the list itself (anything else
    # is refused by `for_each.for_each_errors`, naming the field)
    items: Any
    max_parallel: int | None = None
    # a count of failed items, or a percent of the items ("10%")
    tolerate_failures: int | str = 0
    # for object items: the field whose value names the item
    key: str | None = None


class ApproversSpec(BaseModel):
    """Who may approve a gate: any listed user, or any member of a listed group."""

    model_config = _MODEL_CONFIG

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


class ApprovalSpec(BaseModel):
    """A task's ``approval``: a gate that runs no Job and passes when ``required`` people
    approve it (``flowforge.domain.approval``)."""

    model_config = _MODEL_CONFIG

    # None: anyone who holds the ``approve`` verb on the run
    approvers: ApproversSpec | None = None
    required: int = 1
    # the run's creator may not approve it
    forbid_self: bool = False
    timeout_seconds: int | None = None
    on_timeout: str = "Reject"


class TaskSpec(BaseModel):
    """A forward task of the DAG or, when ``compensate_for`` is set, a compensator."""

    model_config = _MODEL_CONFIG

    key: str
    # None only for an approval gate (``approval``), which runs no Job
    type: str | None = None
    depends_on: tuple[str, ...] = ()
    config: dict[str, Any] = Field(default_factory=dict)
    retries: int = 0
    timeout_seconds: int | None = None
    compensate_for: str | None = None
    # a CEL expression over ``params``: the task runs only when it is true (`conditions.py`)
    when: str | None = None
    # one instance of the task per item (`for_each.py`); not on a compensator
    for_each: ForEachSpec | None = None
    # a compensator's ``compensateOn``: ``Attempted`` also undoes its task when the task's
    # last attempt failed after its container had started (``flowforge.domain.undo``)
    compensate_on: str | None = None
    # an approval gate instead of a Job (``flowforge.domain.approval``)
    approval: ApprovalSpec | None = None

    @property
    def is_compensator(self) -> bool:
        return self.compensate_for is not None

    @property
    def is_gate(self) -> bool:
        return self.approval is not None


class ParameterSpec(BaseModel):
    """One declared parameter of ``spec.parameters``: a JSON Schema subset
    (`flowforge.domain.parameters` checks values against it)."""

    model_config = _MODEL_CONFIG

    name: str
    type: str
    description: str = ""
    enum: tuple[Any, ...] | None = None
    # None: no default (JSON null is no parameter type's value)
    default: Any = None
    pattern: str | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    min_items: int | None = None
    max_items: int | None = None
    items: dict[str, Any] | None = None
    required: bool = False


class ConcurrencySpec(BaseModel):
    """``spec.concurrency``: how many runs of the workflow (per key) run at once."""

    model_config = _MODEL_CONFIG

    max_runs: int
    key: tuple[str, ...] = ()
    policy: str = "Queue"


class DefinitionSpec(BaseModel):
    """The ``spec`` of a WorkflowDefinition: identity, task types and tasks."""

    model_config = _MODEL_CONFIG

    workflow: str
    version: int
    description: str = ""
    task_types: dict[str, ContainerTemplate] = Field(default_factory=dict)
    max_parallel_tasks: int | None = None
    concurrency: ConcurrencySpec | None = None
    tasks: tuple[TaskSpec, ...]
    # run once the outcome is decided, in order (`flowforge.domain.final_tasks`)
    finally_tasks: tuple[TaskSpec, ...] = Field(default=(), alias="finally")
    # typed run parameters; none declared: a run's parameters are free strings, as before
    parameters: tuple[ParameterSpec, ...] = ()
    # Kueue defaults for the task types that set none of their own
    queue_name: str | None = None
    workload_priority_class: str | None = None
    admission_timeout_seconds: int | None = None

    @cached_property
    def _tasks_by_key(self) -> Mapping[str, TaskSpec]:
        return MappingProxyType({task.key: task for task in (*self.tasks, *self.finally_tasks)})

    @cached_property
    def forward_tasks(self) -> tuple[TaskSpec, ...]:
        """The tasks of the DAG, in declaration order."""
        return tuple(task for task in self.tasks if task.compensate_for is None)

    @cached_property
    def compensators(self) -> Mapping[str, TaskSpec]:
        """Forward task key -> the task that compensates it."""
        return MappingProxyType(
            {task.compensate_for: task for task in self.tasks if task.compensate_for is not None}
        )

    def task(self, key: str) -> TaskSpec:
        """The task with ``key`` (a ``finally`` one too); KeyError when there is none."""
        return self._tasks_by_key[key]

    def task_of(self, key: str) -> TaskSpec:
        """The task a run's task row runs: ``key`` itself, or the task of the instance
        ``key`` of a ``forEach`` (``task[item]``, `for_each.py`); KeyError when none."""
        return self._tasks_by_key[key.partition("[")[0]]

    @cached_property
    def graph(self) -> DependencyGraph:
        """The dependency graph of the forward tasks."""
        return DependencyGraph({task.key: task.depends_on for task in self.forward_tasks})

    @cached_property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` over everything that decides what a run does."""
        return fingerprint(self)

    def to_document(self) -> dict[str, Any]:
        """The camelCase ``spec`` document; ``model_validate`` of it gives an equal spec."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)
