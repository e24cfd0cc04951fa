"""One DAG primitive and the constructors over it: ``task``, ``chain``, ``group``, ``chord``.

Every constructor returns a :class:`Dag`: tasks, the edges between them, its roots (tasks
with no upstream inside it) and its leaves (tasks with no downstream inside it). Composing
never adds a second dependency mechanism; it only adds edges from the leaves of one part to
the roots of the next. Because a leaf is a sink of its part, "after the leaves" means "after
everything in the part", which is what makes a chord's callback wait for its whole body.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flowforge.domain.errors import UserError


class CompositionError(UserError, ValueError):
    """A composition that cannot become a workflow (a task key used twice, an empty group)."""


@dataclass(frozen=True, slots=True)
class TaskNode:
    """One task of a workflow; ``compensated_by`` is the task that undoes it on rollback."""

    key: str
    type: str
    config: Mapping[str, Any]
    retries: int | None = None
    timeout_seconds: int | None = None
    compensated_by: TaskNode | None = None
    when: str | None = None
    # the task's forEach ({"items": ..., "maxParallel": ...}, `docs/foreach.md`)
    for_each: Mapping[str, Any] | None = None

    def taken_keys(self) -> tuple[str, ...]:
        """Its own key and its compensator's, if any: the keys it takes up in a workflow."""
        if self.compensated_by is None:
            return (self.key,)
        return (self.key, self.compensated_by.key)


@dataclass(frozen=True, slots=True)
class Dag:
    """Tasks and the edges between them; build it with the constructors, not directly.

    ``nodes`` are in composition order, which is a topological order: every edge
    ``(upstream, downstream)`` goes from an earlier node to a later one.
    """

    nodes: tuple[TaskNode, ...]
    edges: tuple[tuple[str, str], ...]
    roots: tuple[str, ...]
    leaves: tuple[str, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        """The forward task keys, in composition order."""
        return tuple(node.key for node in self.nodes)

    def dependencies(self) -> dict[str, tuple[str, ...]]:
        """Task key -> the keys it depends on directly, sorted; every task is present."""
        upstream: dict[str, list[str]] = {node.key: [] for node in self.nodes}
        for source, target in self.edges:
            upstream[target].append(source)
        return {key: tuple(sorted(keys)) for key, keys in upstream.items()}


def task(
    key: str,
    type: str,
    *,
    config: Mapping[str, Any] | None = None,
    retries: int | None = None,
    timeout_seconds: int | None = None,
    compensated_by: Dag | None = None,
    when: str | None = None,
    for_each: Mapping[str, Any] | None = None,
) -> Dag:
    """A DAG of one task. ``compensated_by`` is another ``task(...)`` that undoes this one;
    ``when`` a CEL condition over the workflow's declared parameters
    (``"params.mode == 'full'"``): false, the task is skipped and its dependents run;
    ``for_each`` its ``forEach`` (``{"items": "params.regions", "maxParallel": 2}``): one
    instance of the task per item, its compensator once per item that succeeded.

    The full rules (key format, limits) are checked when :func:`workflow` builds the document.
    """
    _require_text(key, "key")
    _require_text(type, "type")
    if config is not None and not isinstance(config, Mapping):
        raise CompositionError(f'task "{key}": config must be a mapping, not {_kind(config)}')
    compensator = None if compensated_by is None else single_task(compensated_by, role=key)
    node = TaskNode(
        key=key,
        type=type,
        config=copy.deepcopy(dict(config or {})),
        retries=retries,
        timeout_seconds=timeout_seconds,
        compensated_by=compensator,
        when=when,
        for_each=None if for_each is None else copy.deepcopy(dict(for_each)),
    )
    _reject_duplicates([node])
    return Dag(nodes=(node,), edges=(), roots=(key,), leaves=(key,))


def chain(*steps: Dag) -> Dag:
    """Each step starts when the one before it has finished: every leaf of a step precedes
    every root of the next."""
    parts = _parts(steps, "chain")
    nodes = _concatenated_nodes(parts)
    edges: list[tuple[str, str]] = [edge for part in parts for edge in part.edges]
    for before, after in itertools.pairwise(parts):
        edges.extend((leaf, root) for leaf in before.leaves for root in after.roots)
    return Dag(nodes=nodes, edges=tuple(edges), roots=parts[0].roots, leaves=parts[-1].leaves)


def group(*branches: Dag) -> Dag:
    """Branches that run independently of each other."""
    parts = _parts(branches, "group")
    return Dag(
        nodes=_concatenated_nodes(parts),
        edges=tuple(edge for part in parts for edge in part.edges),
        roots=tuple(root for part in parts for root in part.roots),
        leaves=tuple(leaf for part in parts for leaf in part.leaves),
    )


def chord(body: Dag, callback: Dag) -> Dag:
    """``callback`` starts once everything in ``body`` has finished."""
    return chain(_dag(body, "chord body"), _dag(callback, "chord callback"))


def single_task(dag: Dag, *, role: str) -> TaskNode:
    """The one task of ``dag``, used as the compensator of the task ``role``."""
    where = f'the compensator of "{role}"'
    node = _dag(dag, where).nodes
    if len(node) != 1:
        raise CompositionError(
            f"{where} must be a single task(...), not a composition of {len(node)} tasks"
        )
    if node[0].compensated_by is not None:
        raise CompositionError(f'{where} ("{node[0].key}") cannot have a compensator itself')
    return node[0]


def _parts(parts: tuple[Dag, ...], constructor: str) -> tuple[Dag, ...]:
    if not parts:
        raise CompositionError(f"{constructor}() needs at least one step")
    return tuple(
        _dag(part, f"{constructor}() argument {index + 1}") for index, part in enumerate(parts)
    )


def _dag(value: object, where: str) -> Dag:
    if not isinstance(value, Dag):
        raise CompositionError(
            f"{where} must be a task(...), chain(...), group(...) or chord(...), not {_kind(value)}"
        )
    return value


def _concatenated_nodes(parts: Iterable[Dag]) -> tuple[TaskNode, ...]:
    nodes = tuple(node for part in parts for node in part.nodes)
    _reject_duplicates(nodes)
    return nodes


def _reject_duplicates(nodes: Iterable[TaskNode]) -> None:
    seen: set[str] = set()
    for node in nodes:
        for key in node.taken_keys():
            if key in seen:
                raise CompositionError(
                    f'task key "{key}" is used more than once in this composition; '
                    "every task, compensators included, needs its own key"
                )
            seen.add(key)


def _require_text(value: object, field: str) -> None:
    if not isinstance(value, str) or not value:
        raise CompositionError(f"task {field} must be a non-empty string, not {value!r}")


def _kind(value: object) -> str:
    return type(value).__name__
