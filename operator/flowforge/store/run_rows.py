"""The rows ``create_run`` (`runs.py`) writes for a run's expansion
(``domain/expansion.py``): one per forward task or forEach instance and per compensator, in
the columns of ``flowforge_task``, and the item columns of the forEach instances."""

from __future__ import annotations

from typing import Any

from flowforge.domain.expansion import Expansion, compensator_rows
from flowforge.domain.for_each import instance_key, tolerated_failures
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.states import CompensationState, TaskRole, TaskState


def task_rows(
    spec: DefinitionSpec, expansion: Expansion, reused: frozenset[str]
) -> list[tuple[Any, ...]]:
    """One row per forward task or forEach instance (roots and tasks whose upstreams are all reused
    ``ready``, or ``awaiting`` for an approval gate, reused ones ``succeeded``, those whose
    condition is false or whose forEach has no items ``skipped``, the rest ``waiting``) and per
    compensator (per instance for a forEach task), with its position and whether it is an approval
    gate: forward tasks in topological order (a forEach's instances in item order), compensators in
    the order a rollback runs them (a forEach compensator's instances share one), ``finally``
    tasks ``waiting`` in their list order. A task waits for
    its upstreams in ``expansion`` (a condition-skipped one's own upstreams stand in for it)."""
    graph = spec.graph
    ready = set(expansion.graph.ready_tasks(reused))
    rows: list[tuple[Any, ...]] = []
    for key in graph.topological_order():
        task = spec.task(key)
        for member in expansion.groups.get(key) or (key,):
            if member in expansion.skipped or member in expansion.groups:
                state = TaskState.SKIPPED  # when false, or a forEach without items
            elif member in reused:
                state = TaskState.SUCCEEDED
            elif member in ready:  # a gate awaits people, never a Job (`domain/approval.py`)
                state = TaskState.AWAITING if task.is_gate else TaskState.READY
            else:
                state = TaskState.WAITING
            pending = (
                0
                if state is not TaskState.WAITING
                else len(set(expansion.dependencies[member]) - reused)
            )
            rows.append(
                (
                    member,
                    TaskRole.FORWARD,
                    state,
                    None,
                    task.retries + 1,
                    task.approval.timeout_seconds if task.approval else task.timeout_seconds,
                    pending,
                    len(rows),
                    task.is_gate,
                )
            )
    by_forward = {forward: compensator.key for forward, compensator in spec.compensators.items()}
    rollback = graph.compensation_order(graph.keys, by_forward)
    position = {key: index for index, key in enumerate(rollback)}
    for forward_key, compensator_key in compensator_rows(spec, expansion).items():
        compensator = spec.task_of(compensator_key)
        rows.append(
            (
                compensator_key,
                TaskRole.COMPENSATION,
                CompensationState.NOT_TRIGGERED,
                forward_key,
                compensator.retries + 1,
                compensator.timeout_seconds,
                0,
                position[compensator.key],
                False,
            )
        )
    for index, final in enumerate(spec.finally_tasks):  # in the order they run
        rows.append(
            (
                final.key,
                TaskRole.FINALLY,
                TaskState.WAITING,
                None,
                final.retries + 1,
                final.timeout_seconds,
                0,
                index,
                False,
            )
        )
    return rows


def instance_rows(spec: DefinitionSpec, expansion: Expansion) -> list[tuple[Any, ...]]:
    """Each forEach instance's row key, group, item key, item (JSON text) and, for the
    forward ones, its group's limits (``maxParallel``, the failures it tolerates)."""
    rows: list[tuple[Any, ...]] = []
    compensators = spec.compensators
    for group, members in expansion.groups.items():
        for_each = spec.task(group).for_each
        assert for_each is not None
        tolerated = tolerated_failures(for_each, len(members))
        compensator = compensators.get(group)
        for member in members:
            instance = expansion.instances[member]
            text = instance.item_json
            rows.append((member, group, instance.item_key, text, for_each.max_parallel, tolerated))
            if compensator is not None:
                rows.append(
                    (
                        instance_key(compensator.key, instance.item_key),
                        group,
                        instance.item_key,
                        text,
                        None,
                        None,
                    )
                )
    return rows
