"""Turning a composed :class:`~flowforge.sdk.dag.Dag` into a WorkflowDefinition document."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from flowforge.domain.api import API_VERSION, DEFINITION_KIND
from flowforge.domain.models import ContainerTemplate
from flowforge.domain.validation import parse_definition
from flowforge.sdk.dag import CompositionError, Dag, TaskNode, single_task


def workflow(
    name: str,
    version: int,
    *,
    body: Dag,
    task_types: Mapping[str, ContainerTemplate | Mapping[str, Any]],
    description: str = "",
    compensations: Mapping[str, Dag] | None = None,
    metadata_name: str | None = None,
    namespace: str | None = None,
    parameters: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The WorkflowDefinition document (``apiVersion``, ``kind``, ``metadata``, ``spec``).

    ``compensations`` maps a forward task key to the ``task(...)`` that undoes it, as an
    alternative to ``task(..., compensated_by=...)``. ``metadata_name`` defaults to
    ``<name>-v<version>``. ``parameters`` are the typed parameter declarations
    (``{"name": "mode", "type": "string", "enum": [...], "default": ...}``) that tasks'
    ``when`` read. The document is validated exactly as the cluster validates it;
    InvalidDefinitionError lists every problem when it is not valid. The same arguments always
    give the same document: tasks in composition order, ``dependsOn`` sorted.
    """
    if not isinstance(body, Dag):
        raise CompositionError(
            "body must be a task(...), chain(...), group(...) or chord(...), "
            f"not {type(body).__name__}"
        )
    compensators = _compensators(body, compensations or {})
    dependencies = body.dependencies()
    tasks = [_forward_document(node, dependencies[node.key]) for node in body.nodes]
    tasks.extend(
        _compensator_document(compensators[node.key], compensates=node.key)
        for node in body.nodes
        if node.key in compensators
    )
    spec: dict[str, Any] = {"workflow": name, "version": version}
    if description:
        spec["description"] = description
    spec["taskTypes"] = {
        type_name: _template_document(template) for type_name, template in task_types.items()
    }
    spec["tasks"] = tasks
    if parameters:
        spec["parameters"] = [copy.deepcopy(dict(declaration)) for declaration in parameters]
    metadata: dict[str, Any] = {"name": metadata_name or f"{name}-v{version}"}
    if namespace is not None:
        metadata["namespace"] = namespace
    parse_definition(spec)
    return {
        "apiVersion": API_VERSION,
        "kind": DEFINITION_KIND,
        "metadata": metadata,
        "spec": spec,
    }


def _compensators(body: Dag, extra: Mapping[str, Dag]) -> dict[str, TaskNode]:
    compensators = {
        node.key: node.compensated_by for node in body.nodes if node.compensated_by is not None
    }
    taken = {key for node in body.nodes for key in node.taken_keys()}
    forward_keys = set(body.keys)
    for forward_key, compensator_dag in extra.items():
        if forward_key not in forward_keys:
            raise CompositionError(
                f'compensations names "{forward_key}", which is not a task of the body'
            )
        if forward_key in compensators:
            raise CompositionError(
                f'task "{forward_key}" already has a compensator '
                f'("{compensators[forward_key].key}"); a task has at most one'
            )
        compensator = single_task(compensator_dag, role=forward_key)
        if compensator.key in taken:
            raise CompositionError(
                f'task key "{compensator.key}" is used more than once in this composition; '
                "every task, compensators included, needs its own key"
            )
        taken.add(compensator.key)
        compensators[forward_key] = compensator
    return compensators


def _forward_document(node: TaskNode, depends_on: tuple[str, ...]) -> dict[str, Any]:
    document = _common_fields(node)
    if depends_on:
        document["dependsOn"] = list(depends_on)
    return _with_options(document, node)


def _compensator_document(node: TaskNode, *, compensates: str) -> dict[str, Any]:
    document = _common_fields(node)
    document["compensateFor"] = compensates
    return _with_options(document, node)


def _common_fields(node: TaskNode) -> dict[str, Any]:
    return {"key": node.key, "type": node.type}


def _with_options(document: dict[str, Any], node: TaskNode) -> dict[str, Any]:
    if node.config:
        document["config"] = copy.deepcopy(dict(node.config))
    if node.retries is not None:
        document["retries"] = node.retries
    if node.timeout_seconds is not None:
        document["timeoutSeconds"] = node.timeout_seconds
    if node.when is not None:
        document["when"] = node.when
    if node.for_each is not None:
        document["forEach"] = copy.deepcopy(dict(node.for_each))
    return document


def _template_document(template: ContainerTemplate | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(template, ContainerTemplate):
        return template.model_dump(mode="json", by_alias=True, exclude_none=True)
    return copy.deepcopy(dict(template))
