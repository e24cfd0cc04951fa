"""A published definition as the operator keeps it while its runs go on: only what running
them needs, in a compact form.

The typed models of a 10,000-task definition (``DefinitionSpec``: a pydantic model per task,
its dependency graph, its views) take tens of MiB; a run needs, per task, its type, its
config and what it compensates, and the few task types. Here each task is one slotted
object whose config is kept as compact JSON text (decoded when a Job is built), the type
names are shared, and nothing of the graph is kept: the store holds the run's graph.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from flowforge.domain.models import ContainerTemplate, DefinitionSpec


@dataclass(frozen=True, slots=True)
class CompactTask:
    key: str
    type: str | None  # None: an approval gate, which runs no Job
    compensate_for: str | None
    config_json: str | None  # None: the empty config

    @property
    def config(self) -> dict[str, Any]:
        """The task's config (a fresh copy each time)."""
        if self.config_json is None:
            return {}
        decoded: dict[str, Any] = json.loads(self.config_json)
        return decoded


@dataclass(frozen=True, slots=True)
class CompactSpec:
    workflow: str
    version: int
    task_types: Mapping[str, ContainerTemplate]
    forward_count: int
    _tasks: Mapping[str, CompactTask]
    # the Kueue defaults of task types that name no queue of their own (domain/kueue.py)
    queue_name: str | None = None
    workload_priority_class: str | None = None
    admission_timeout_seconds: int | None = None
    # whether a task has a forEach: its instances' items are files of the run's ConfigMap
    has_items: bool = False
    # the ``finally`` tasks (among ``_tasks`` too), in the order they run
    finally_keys: tuple[str, ...] = ()
    # whether a task is an approval gate: only then may a settle find one overdue
    has_gates: bool = False
    # the key of the one task a run runs when it has no other (no compensator, finally task,
    # forEach, gate or condition): every run of it that starts creates that task's Job
    only_task: str | None = None

    @classmethod
    def of(cls, spec: DefinitionSpec) -> CompactSpec:
        tasks = {
            task.key: CompactTask(
                key=task.key,
                type=None if task.type is None else sys.intern(task.type),
                compensate_for=task.compensate_for,
                config_json=json.dumps(task.config, separators=(",", ":")) if task.config else None,
            )
            for task in (*spec.tasks, *spec.finally_tasks)
        }
        return cls(
            workflow=spec.workflow,
            version=spec.version,
            task_types=MappingProxyType(dict(spec.task_types)),
            forward_count=sum(1 for task in spec.tasks if task.compensate_for is None),
            _tasks=tasks,
            queue_name=spec.queue_name,
            workload_priority_class=spec.workload_priority_class,
            admission_timeout_seconds=spec.admission_timeout_seconds,
            has_items=any(task.for_each is not None for task in spec.tasks),
            finally_keys=tuple(task.key for task in spec.finally_tasks),
            has_gates=any(task.is_gate for task in spec.tasks),
            only_task=_only_task(spec),
        )

    @property
    def task_count(self) -> int:
        return len(self._tasks)

    @property
    def has_compensators(self) -> bool:
        """Whether a run of it can roll back (its deletion then waits for that)."""
        return self.task_count - len(self.finally_keys) > self.forward_count

    def task(self, key: str) -> CompactTask:
        """The task a run's task ``key`` runs: the task with that key, or the forEach task
        (or its compensator) of the instance ``task[item]``; KeyError when there is none."""
        return self._tasks[key.partition("[")[0]]

    def job_type(self, key: str) -> str:
        """The task type whose template makes the Job of the run's task ``key``; an approval
        gate has none (it never gets a Job): LookupError then."""
        job_type = self.task(key).type
        if job_type is None:
            raise LookupError(f'task "{key}" is an approval gate: it runs no Job')
        return job_type

    def tasks(self) -> Iterable[CompactTask]:
        """Every task, forward and compensating."""
        return self._tasks.values()


def _only_task(spec: DefinitionSpec) -> str | None:
    if len(spec.tasks) != 1 or spec.finally_tasks:
        return None
    (task,) = spec.tasks
    plain = task.for_each is None and not task.is_gate and task.when is None
    return task.key if plain else None


@dataclass(frozen=True, slots=True)
class RunDefinition:
    """The definition a run runs: its fingerprint and its compact spec."""

    fingerprint: str
    spec: CompactSpec

    @classmethod
    def of(cls, spec: DefinitionSpec, *, fingerprint: str) -> RunDefinition:
        return cls(fingerprint=fingerprint, spec=CompactSpec.of(spec))
