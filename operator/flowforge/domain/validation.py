"""The two validators of a WorkflowDefinition, in the order that matters.

0. Caps (``caps.py``): a config nested too deeply or too large, or too many edges, is
   reported alone and first: nothing else (least of all anything recursive) reads it.
1. Shape (JSON Schema, then the template rules JSON Schema cannot say, `template_rules.py`):
   when the spec has any shape error, only shape errors are reported, because fixing the
   shape is the cheaper fix and the graph of a malformed spec is noise.
2. Graph: duplicate keys, unknown task types, unknown dependencies, compensation rules and
   cycles, all of them, in document order (the cycle last); then the parameter declarations
   (`parameters.py`) and, when they are sound, every task's ``when`` (`conditions.py`) and
   ``forEach`` (`for_each.py`).

The same functions serve the admission webhook, the offline CLI and the operator's load path.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import ValidationError

from flowforge.domain.approval import gate_errors
from flowforge.domain.caps import definition_cap_errors
from flowforge.domain.conditions import condition_errors
from flowforge.domain.errors import (
    CompensationError,
    CyclicDependencyError,
    DefinitionError,
    DefinitionSchemaError,
    DuplicateTaskKeyError,
    InvalidDefinitionError,
    UnknownDependencyError,
    UnknownTaskTypeError,
)
from flowforge.domain.final_tasks import final_task_errors
from flowforge.domain.for_each import for_each_errors
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.models import DefinitionSpec, TaskSpec
from flowforge.domain.parameters import declaration_errors
from flowforge.domain.schema import format_path, shape_errors
from flowforge.domain.template_rules import template_problems


def validate_spec(spec: object) -> list[DefinitionError]:
    """Every problem of ``spec`` (a ``spec`` document); empty when it is valid."""
    errors, _ = _check(spec)
    return errors


def parse_definition(spec: object) -> DefinitionSpec:
    """The typed definition of a valid ``spec`` document; InvalidDefinitionError otherwise."""
    errors, definition = _check(spec)
    if errors or definition is None:
        raise InvalidDefinitionError(errors)
    return definition


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large definition is read.

    Reading 10,000 tasks allocates a few hundred thousand acyclic objects; each allocation
    burst triggers full collections that walk them all again, a fifth of the time measured
    by bench/bench_definition.py. Nothing allocated here forms a reference cycle.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _check(spec: object) -> tuple[list[DefinitionError], DefinitionSpec | None]:
    with _collector_paused():
        return _check_unpaused(spec)


def _check_unpaused(spec: object) -> tuple[list[DefinitionError], DefinitionSpec | None]:
    capped = definition_cap_errors(spec)
    if capped:
        return [DefinitionSchemaError(message, path=path) for path, message in capped], None
    shape = shape_errors(spec)
    if shape:
        return list(shape), None
    assert isinstance(spec, dict)  # the schema says so
    rules = template_problems(spec)
    if rules:
        return [DefinitionSchemaError(message, path=format_path(at)) for at, message in rules], None
    try:
        definition = DefinitionSpec.model_validate(spec)
    except ValidationError as exc:  # the schema admits nothing the model rejects; be safe
        return [
            DefinitionSchemaError(error["msg"], path=_pydantic_path(error["loc"]))
            for error in exc.errors()
        ], None
    errors = graph_errors(definition)
    if definition.parameters or any(
        task.when is not None or task.for_each is not None for task in definition.tasks
    ):
        declared = declaration_errors(definition)
        errors.extend(declared or [*condition_errors(definition), *for_each_errors(definition)])
    return errors, (None if errors else definition)


def _pydantic_path(location: tuple[int | str, ...]) -> str:
    return "spec" + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in location
    )


def graph_errors(definition: DefinitionSpec) -> list[DefinitionError]:
    """The graph rules, for a spec whose shape is valid; document order, the cycle last."""
    first_index: dict[str, int] = {}
    duplicates = False
    forward_keys: set[str] = set()
    compensator_keys: set[str] = set()
    for index, task in enumerate(definition.tasks):
        first_index.setdefault(task.key, index)
        (forward_keys if task.compensate_for is None else compensator_keys).add(task.key)

    errors: list[DefinitionError] = []
    compensated_by: dict[str, int] = {}
    dangling_edges = False
    gates = False
    for index, task in enumerate(definition.tasks):
        gates = gates or task.is_gate
        if (
            first_index[task.key] == index
            and task.type in definition.task_types
            and task.compensate_for is None
            and task.compensate_on is None
            and forward_keys.issuperset(task.depends_on)
        ):
            continue  # the common case, decided without building paths
        where = f"spec.tasks[{index}]"
        if first_index[task.key] != index:
            duplicates = True
            errors.append(
                DuplicateTaskKeyError(
                    f'duplicate task key "{task.key}" (first declared at '
                    f"spec.tasks[{first_index[task.key]}])",
                    path=f"{where}.key",
                )
            )
        if task.type is not None and task.type not in definition.task_types:
            errors.append(_unknown_type(task, definition, path=f"{where}.type"))
        if task.compensate_for is None:
            if task.compensate_on is not None:
                errors.append(
                    CompensationError(
                        f'task "{task.key}" sets compensateOn but compensates nothing; only a '
                        "compensation task (compensateFor) chooses what it undoes",
                        path=f"{where}.compensateOn",
                    )
                )
            for position, dependency in enumerate(task.depends_on):
                if dependency in forward_keys:
                    continue
                dangling_edges = True
                errors.append(
                    _bad_dependency(
                        task,
                        dependency,
                        is_compensator=dependency in compensator_keys,
                        path=f"{where}.dependsOn[{position}]",
                    )
                )
        else:
            errors.extend(
                _compensation_errors(
                    task,
                    where=where,
                    forward_keys=forward_keys,
                    compensator_keys=compensator_keys,
                    compensated_by=compensated_by,
                    index=index,
                )
            )
    if gates or not all(task.type for task in definition.tasks):
        errors.extend(gate_errors(definition))
    if definition.finally_tasks:
        errors.extend(final_task_errors(definition))
    if not duplicates:
        cycle = _find_cycle(definition, forward_keys=forward_keys, dangling_edges=dangling_edges)
        if cycle is not None:
            errors.append(CyclicDependencyError(cycle))
    return errors


def _find_cycle(
    definition: DefinitionSpec, *, forward_keys: set[str], dangling_edges: bool
) -> tuple[str, ...] | None:
    if not dangling_edges:
        # the definition's own graph: its order is then computed once, here, and reused
        return definition.graph.find_cycle()
    graph = DependencyGraph(
        {
            task.key: [key for key in task.depends_on if key in forward_keys]
            for task in definition.forward_tasks
        }
    )
    return graph.find_cycle()


def _unknown_type(task: TaskSpec, definition: DefinitionSpec, *, path: str) -> DefinitionError:
    known = ", ".join(sorted(definition.task_types)) or "none"
    return UnknownTaskTypeError(
        f'task "{task.key}" has type "{task.type}", which is not in taskTypes (declared: {known})',
        path=path,
    )


def _bad_dependency(
    task: TaskSpec, dependency: str, *, is_compensator: bool, path: str
) -> DefinitionError:
    if is_compensator:
        return CompensationError(
            f'task "{task.key}" depends on compensation task "{dependency}"; a forward task '
            "cannot depend on a compensator",
            path=path,
        )
    return UnknownDependencyError(
        f'task "{task.key}" depends on unknown task "{dependency}"', path=path
    )


def _compensation_errors(
    task: TaskSpec,
    *,
    where: str,
    forward_keys: set[str],
    compensator_keys: set[str],
    compensated_by: dict[str, int],
    index: int,
) -> list[DefinitionError]:
    errors: list[DefinitionError] = []
    target = task.compensate_for
    if task.depends_on:
        errors.append(
            CompensationError(
                f'compensation task "{task.key}" must not declare dependsOn; it runs on its own '
                "during rollback",
                path=f"{where}.dependsOn",
            )
        )
    path = f"{where}.compensateFor"
    if target == task.key:
        errors.append(CompensationError(f'task "{task.key}" cannot compensate itself', path=path))
    elif target in compensator_keys:
        errors.append(
            CompensationError(
                f'task "{task.key}" compensates "{target}", which is itself a compensation task',
                path=path,
            )
        )
    elif target not in forward_keys:
        errors.append(
            CompensationError(f'task "{task.key}" compensates unknown task "{target}"', path=path)
        )
    elif target in compensated_by:
        errors.append(
            CompensationError(
                f'task "{target}" already has a compensation task (spec.tasks'
                f"[{compensated_by[target]}]); a forward task has at most one",
                path=path,
            )
        )
    else:
        assert target is not None
        compensated_by[target] = index
    return errors
