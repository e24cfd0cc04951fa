"""The content identity of a definition: ``sha256:<hex>``.

It covers everything that changes what a run does (workflow, version, description, the task types'
templates, the definition's Kueue defaults, every task's key, type, dependencies, compensateFor,
retries, timeout, config, ``when`` and ``forEach``, a compensator's ``compensateOn: Attempted``, an
approval gate's ``approval``, the run limits ``maxParallelTasks`` and ``concurrency`` when set, and
the typed parameter declarations) and nothing that does not: task declaration order, ``dependsOn``
order and mapping key order are normalised away; list order inside config is kept. A number that
JSON writes as an integer (``2.0`` from some clients) counts as that integer, as Kubernetes stores
it.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowforge.domain.models import DefinitionSpec

FINGERPRINT_PREFIX = "sha256:"
_FORMAT = "flowforge.io/fingerprint/v1"


def fingerprint(spec: DefinitionSpec) -> str:
    """The fingerprint of ``spec``."""
    payload: dict[str, Any] = {
        "format": _FORMAT,
        "workflow": spec.workflow,
        "version": spec.version,
        "description": spec.description,
        "taskTypes": {
            name: _normalise_numbers(
                template.model_dump(mode="json", by_alias=True, exclude_none=True)
            )
            for name, template in spec.task_types.items()
        },
        "tasks": sorted(
            (
                {
                    "key": task.key,
                    "type": task.type,
                    "dependsOn": sorted(set(task.depends_on)),
                    "compensateFor": task.compensate_for,
                    "retries": task.retries,
                    "timeoutSeconds": task.timeout_seconds,
                    "config": _normalise_numbers(task.config) if task.config else {},
                }
                | ({"when": task.when} if task.when is not None else {})
                | (
                    {
                        "forEach": _normalise_numbers(
                            task.for_each.model_dump(
                                mode="json", by_alias=True, exclude_defaults=True
                            )
                        )
                    }
                    if task.for_each is not None
                    else {}
                )
                # compensateOn only when it changes what a run does, so earlier
                # fingerprints stay the same
                | (
                    {"compensateOn": task.compensate_on}
                    if task.compensate_on == "Attempted"
                    else {}
                )
                | (
                    {
                        "approval": _normalise_numbers(
                            task.approval.model_dump(mode="json", by_alias=True)
                        )
                    }
                    if task.approval is not None
                    else {}
                )
                for task in spec.tasks
            ),
            key=lambda task: task["key"],
        ),
    }
    if spec.finally_tasks:  # in their order, which is the order they run in
        payload["finally"] = [
            {
                "key": task.key,
                "type": task.type,
                "retries": task.retries,
                "timeoutSeconds": task.timeout_seconds,
                "config": _normalise_numbers(task.config) if task.config else {},
            }
            for task in spec.finally_tasks
        ]
    # the definition's Kueue defaults, only when set (earlier fingerprints stay the same)
    for field, value in (
        ("queueName", spec.queue_name),
        ("workloadPriorityClass", spec.workload_priority_class),
        ("admissionTimeoutSeconds", spec.admission_timeout_seconds),
    ):
        if value is not None:
            payload[field] = value
    # the limits only when set, so a definition without them keeps the fingerprint it had
    if spec.max_parallel_tasks is not None:
        payload["maxParallelTasks"] = spec.max_parallel_tasks
    if spec.concurrency is not None:
        payload["concurrency"] = spec.concurrency.model_dump(mode="json", by_alias=True)
    # typed parameters (declaration order kept: it is how they are documented) and each
    # task's ``when``, only when present
    if spec.parameters:
        payload["parameters"] = [
            _normalise_numbers(
                declaration.model_dump(mode="json", by_alias=True, exclude_defaults=True)
            )
            for declaration in spec.parameters
        ]
    text = json.dumps(
        payload,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return FINGERPRINT_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _normalise_numbers(value: Any) -> Any:
    """Integral floats become ints, iteratively (config may nest deeply)."""
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        container, index = stack.pop()
        item = container[index]
        if isinstance(item, float) and item.is_integer():
            container[index] = int(item)
        elif isinstance(item, dict):
            copy = dict(item)
            container[index] = copy
            stack.extend((copy, key) for key in copy)
        elif isinstance(item, list | tuple):
            copy_list = list(item)
            container[index] = copy_list
            stack.extend((copy_list, position) for position in range(len(copy_list)))
    return root[0]
