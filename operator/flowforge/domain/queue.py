"""How much runs at once: the limits, as plain rules the store's transactions apply.

Three limits hold a run or a task back, all decided in the PostgreSQL transaction that
dispatches (``flowforge.store.queue``), never in memory:

- **per run**: ``maxParallelTasks`` (the definition's default, lowered by the run, capped by
  the namespace's FlowForgePolicy ``caps.maxParallelTasks``) counts the run's running tasks,
  forward tasks and compensators alike (the rollback stays one at a time anyway);
- **per workflow**: the definition's ``spec.concurrency`` (``maxRuns`` per key, the key built
  from the run's parameters) with a policy for a run over it: ``Queue`` waits, ``Forbid`` is
  refused at admission, ``Replace`` cancels the oldest running run of the key (which rolls
  back) and starts once that one has finished;
- **per namespace**: the FlowForgePolicy's ``maxRunningRuns`` and ``maxRunningTasks``.

A run over a run limit is ``Queued``, ordered by ``spec.priority`` (higher first), then by
creation (first come first served); a task over a task limit stays ``ready``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flowforge.domain.models import DefinitionSpec
from flowforge.domain.policy_spec import PolicySpec


class ConcurrencyPolicy(StrEnum):
    QUEUE = "Queue"
    FORBID = "Forbid"
    REPLACE = "Replace"


class QueueReason(StrEnum):
    """Which limit holds a queued run (the ``Queued`` condition's reason)."""

    WORKFLOW_CONCURRENCY = "WorkflowConcurrency"
    NAMESPACE_RUN_LIMIT = "NamespaceRunLimit"
    REPLACING = "Replacing"
    # a duplicate (spec.idempotencyKey) waits for its original's result; it never runs
    IDEMPOTENCY_KEY = "IdempotencyKey"


@dataclass(frozen=True)
class NamespaceLimits:
    """The namespace's limits: the lowest of every FlowForgePolicy's (None: unlimited)."""

    max_running_runs: int | None = None
    max_running_tasks: int | None = None
    max_parallel_tasks: int | None = None


def _lowest(values: Iterable[int | None]) -> int | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def namespace_limits(policies: Iterable[PolicySpec]) -> NamespaceLimits:
    """Every policy of a namespace applies: each limit is the lowest any of them sets."""
    specs = list(policies)
    return NamespaceLimits(
        max_running_runs=_lowest(spec.max_running_runs for spec in specs),
        max_running_tasks=_lowest(spec.max_running_tasks for spec in specs),
        max_parallel_tasks=_lowest(spec.caps.max_parallel_tasks for spec in specs),
    )


def concurrency_key(spec: DefinitionSpec, parameters: Mapping[str, Any]) -> str | None:
    """The key a run counts under for ``spec.concurrency`` (None: the workflow has none):
    the workflow's name, and the values of the key's parameters (a missing one is empty)."""
    if spec.concurrency is None:
        return None
    if not spec.concurrency.key:
        return spec.workflow
    values = [str(parameters.get(name, "")) for name in spec.concurrency.key]
    return f"{spec.workflow}/{json.dumps(values, ensure_ascii=False, separators=(',', ':'))}"


def key_description(spec: DefinitionSpec, parameters: Mapping[str, Any]) -> str:
    """``workflow etl`` or ``workflow etl with tenant=a``: the key, for messages."""
    text = f"workflow {spec.workflow}"
    if spec.concurrency is not None and spec.concurrency.key:
        pairs = ", ".join(f"{name}={parameters.get(name, '')}" for name in spec.concurrency.key)
        text += f" with {pairs}"
    return text


def run_parallelism(spec: DefinitionSpec, requested: int | None) -> int | None:
    """The run's own ``maxParallelTasks``: the definition's, lowered by the run's (the
    namespace's cap is applied by the store as it is when it dispatches)."""
    return _lowest((spec.max_parallel_tasks, requested))


def parallelism_error(spec: DefinitionSpec, requested: int | None) -> str | None:
    """A run may lower the definition's ``maxParallelTasks``, never raise it."""
    if requested is None or spec.max_parallel_tasks is None:
        return None
    if requested <= spec.max_parallel_tasks:
        return None
    return (
        f"spec.maxParallelTasks: {requested} is above the definition's "
        f"spec.maxParallelTasks ({spec.max_parallel_tasks}); a run may only lower it"
    )


def key_parameter_errors(spec: DefinitionSpec, parameters: Mapping[str, Any]) -> list[str]:
    """Each parameter of the concurrency key must be given: a run without it would count
    under an empty value, which nobody meant."""
    if spec.concurrency is None:
        return []
    return [
        f"spec.parameters.{name}: required, it is part of the spec.concurrency.key of "
        f"workflow {spec.workflow}"
        for name in spec.concurrency.key
        if name not in parameters
    ]


def forbidden_message(
    spec: DefinitionSpec, parameters: Mapping[str, Any], *, running: int
) -> str | None:
    """Why a run of a ``Forbid`` workflow is refused now, or None when it may start."""
    concurrency = spec.concurrency
    if concurrency is None or concurrency.policy != ConcurrencyPolicy.FORBID:
        return None
    if running < concurrency.max_runs:
        return None
    return (
        f"spec.workflow: {key_description(spec, parameters)} already has {running} runs "
        f"running or queued (spec.concurrency.maxRuns is {concurrency.max_runs}, policy "
        "Forbid); wait for one to finish"
    )


def queue_message(reason: QueueReason, *, position: int, queued: int, limit: int | None) -> str:
    """The ``Queued`` condition's message: the limit that holds the run, and where it is."""
    held = {
        QueueReason.WORKFLOW_CONCURRENCY: f"spec.concurrency.maxRuns ({limit}) of its workflow",
        QueueReason.NAMESPACE_RUN_LIMIT: f"the namespace's maxRunningRuns ({limit})",
        QueueReason.REPLACING: "an older run of its key being cancelled to make room",
        QueueReason.IDEMPOTENCY_KEY: "the result of the earlier run with the same "
        "spec.idempotencyKey (this run will not execute)",
    }[reason]
    return f"waiting for {held}: position {position} of {queued} queued in the namespace"
