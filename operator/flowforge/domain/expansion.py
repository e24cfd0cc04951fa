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
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from flowforge.domain.conditions import evaluate
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
    return bool(message) and str(message).startswith(CONDITION_FALSE + ":")


@dataclass(frozen=True)
class Expansion:
    """What a run of a definition with some parameters does."""

    parameters: Mapping[str, Any]  # effective: checked, defaults filled in (recorded)
    skipped: frozenset[str]  # forward tasks whose ``when`` is false
    # each forward task that runs -> the tasks that run and that it waits for
    dependencies: Mapping[str, tuple[str, ...]]

    def runs(self, key: str) -> bool:
        return key not in self.skipped

    @property
    def graph(self) -> DependencyGraph:
        """The graph of the tasks that run."""
        return DependencyGraph(self.dependencies)

    def levels(self) -> list[list[str]]:
        """The tasks that run, by level (ties by key), as the operator schedules them."""
        return [list(level) for level in self.graph.levels()]


def expand(definition: DefinitionSpec, raw_parameters: Mapping[str, Any]) -> Expansion:
    """The run of ``definition`` with ``raw_parameters`` (a run's ``spec.parameters``).

    ParameterError (`parameters.py`) or ConditionError (`conditions.py`) name the field
    that refuses it. Expanding its own ``parameters`` again gives the same expansion.
    """
    values = effective_parameters(definition, raw_parameters)
    skipped: set[str] = set()
    index_of = {task.key: index for index, task in enumerate(definition.tasks)}
    for task in definition.forward_tasks:
        if task.when is not None and not evaluate(
            task.when, values, path=f"spec.tasks[{index_of[task.key]}].when"
        ):
            skipped.add(task.key)
    dependencies: dict[str, tuple[str, ...]] = {}
    if not skipped:
        dependencies = {task.key: task.depends_on for task in definition.forward_tasks}
    else:
        through: dict[str, tuple[str, ...]] = {}  # a skipped task -> what it waited for
        for key in definition.graph.topological_order():
            waits: dict[str, None] = {}
            for upstream in definition.task(key).depends_on:
                if upstream in skipped:
                    waits.update(dict.fromkeys(through[upstream]))
                else:
                    waits[upstream] = None
            if key in skipped:
                through[key] = tuple(waits)
            else:
                dependencies[key] = tuple(waits)
    return Expansion(
        parameters=MappingProxyType(values),
        skipped=frozenset(skipped),
        dependencies=MappingProxyType(dependencies),
    )
