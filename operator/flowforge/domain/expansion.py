"""A run's shape: the pure function of its definition and its parameters.

No data flows along edges, so everything a run will do is known when it is created:
``expand(definition, raw_parameters)`` checks the parameters (`parameters.py`), fills in the
defaults and decides every task's ``when`` (`conditions.py`). The operator's ``create_run``
writes what it returns in the run's one transaction, the webhook refuses a run it cannot
expand, and ``flowforge plan -p`` prints it: one function, so the three always agree.

A task whose condition is false is skipped with reason ``ConditionFalse``: it runs no Job,
its compensator never runs, and its dependents run as if it had succeeded. "As if it had
succeeded" keeps the order the graph promised: a dependent still waits for the skipped
task's own upstreams (the skipped task's edges are contracted onto its dependents).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from flowforge.domain.conditions import evaluate
from flowforge.domain.for_each import NO_ITEMS, Instance, check_total, instance_key, instances
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.parameters import effective_parameters

if TYPE_CHECKING:
    from flowforge.domain.models import DefinitionSpec

CONDITION_FALSE: Final = "ConditionFalse"


def condition_false_message(expression: str) -> str:
    """What a condition-skipped task records as its reason's message."""
    return f"{CONDITION_FALSE}: when {expression!r} is false"


def is_condition_false(message: str | None) -> bool:
    """Whether a skipped task's recorded message says its condition was false."""
    return creation_skip_reason(message) == CONDITION_FALSE


# the reasons of the tasks a run skips when it is created, each its message's first word
CREATION_SKIP_REASONS: Final = (CONDITION_FALSE, NO_ITEMS)


def creation_skip_reason(message: str | None) -> str | None:
    """Why a task was skipped when its run was created (``ConditionFalse``, ``NoItems``),
    from its recorded message; None for any other message."""
    reason, colon, _ = (message or "").partition(":")
    return reason if colon and reason in CREATION_SKIP_REASONS else None


@dataclass(frozen=True)
class Expansion:
    """What a run of a definition with some parameters does. Its task keys are the
    definition's forward task keys, except that a ``forEach`` task is its instances
    (``task[item]``, `for_each.py`)."""

    parameters: Mapping[str, Any]  # effective: checked, defaults filled in (recorded)
    skipped: frozenset[str]  # forward tasks whose ``when`` is false
    # each run task (forward task or instance) that runs -> the ones it waits for
    dependencies: Mapping[str, tuple[str, ...]]
    # each forEach task that runs -> its instances' keys, in item order (none: no items)
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # instance key -> the instance
    instances: Mapping[str, Instance] = field(default_factory=lambda: MappingProxyType({}))

    def runs(self, key: str) -> bool:
        return key not in self.skipped

    @property
    def empty(self) -> frozenset[str]:
        """The forEach tasks whose list is empty: like a skipped task, they run nothing."""
        return frozenset(key for key, members in self.groups.items() if not members)

    @property
    def graph(self) -> DependencyGraph:
        """The graph of the tasks that run."""
        return DependencyGraph(self.dependencies)

    def levels(self) -> list[list[str]]:
        """The tasks that run, by level (ties by key), as the operator schedules them."""
        return [list(level) for level in self.graph.levels()]


def expand(definition: DefinitionSpec, raw_parameters: Mapping[str, Any]) -> Expansion:
    """The run of ``definition`` with ``raw_parameters`` (a run's ``spec.parameters``).

    ParameterError (`parameters.py`), ConditionError (`conditions.py`) or ItemsError
    (`for_each.py`) name the field that refuses it. Expanding its own ``parameters`` again
    gives the same expansion.
    """
    values = effective_parameters(definition, raw_parameters)
    skipped: set[str] = set()
    index_of = {task.key: index for index, task in enumerate(definition.tasks)}
    groups: dict[str, tuple[Instance, ...]] = {}
    for task in definition.forward_tasks:
        if task.when is not None and not evaluate(
            task.when, values, path=f"spec.tasks[{index_of[task.key]}].when"
        ):
            skipped.add(task.key)
        elif task.for_each is not None:
            groups[task.key] = instances(task, values, index=index_of[task.key])
    if groups:
        compensated = definition.compensators
        check_total(
            [(index_of[key], made) for key, made in groups.items()],
            tasks=len(definition.tasks)
            + sum(
                (len(made) - 1) * (2 if key in compensated else 1) for key, made in groups.items()
            ),
        )
    dependencies: dict[str, tuple[str, ...]] = {}
    if not skipped and not groups:
        dependencies = {task.key: task.depends_on for task in definition.forward_tasks}
    else:
        # a task -> the run tasks that stand for it: itself, its instances, or (skipped, or
        # a forEach without items) what it waited for
        members: dict[str, tuple[str, ...]] = {}
        for key in definition.graph.topological_order():
            waits = tuple(
                dict.fromkeys(
                    member
                    for upstream in definition.task(key).depends_on
                    for member in members[upstream]
                )
            )
            made = groups.get(key)
            if key in skipped or made == ():
                members[key] = waits
            elif made is not None:
                members[key] = tuple(instance.key for instance in made)
                dependencies.update(dict.fromkeys(members[key], waits))
            else:
                members[key] = (key,)
                dependencies[key] = waits
    return Expansion(
        parameters=MappingProxyType(values),
        skipped=frozenset(skipped),
        dependencies=MappingProxyType(dependencies),
        groups=MappingProxyType(
            {key: tuple(instance.key for instance in made) for key, made in groups.items()}
        ),
        instances=MappingProxyType(
            {instance.key: instance for made in groups.values() for instance in made}
        ),
    )


def compensator_rows(definition: DefinitionSpec, expansion: Expansion) -> dict[str, str]:
    """The run's compensators: the key of each forward run task that has one -> the
    compensator's run key (for a forEach task, one per instance: ``undo[item]``)."""
    rows: dict[str, str] = {}
    for forward, compensator in definition.compensators.items():
        members = expansion.groups.get(forward)
        if members is None:
            rows[forward] = compensator.key
            continue
        for member in members:
            instance = expansion.instances[member]
            rows[member] = instance_key(compensator.key, instance.item_key)
    return rows
