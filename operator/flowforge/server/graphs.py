"""A run's graph as the API's JSON (``models.Graph``), built in two parts: what the definition
decides (nodes, edges, levels, compensators), serialised once per definition (the server
caches it by fingerprint, definitions being immutable, weighed by ``size``), and the tasks'
states and the rollback's order, laid over it per request. A 10,000-task graph is one join
of strings, not 10,000 models.

The shape is ``models.Graph`` (the OpenAPI document says so); tests/server holds the two
together by validating what ``render`` writes against the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring
from typing import Final

from flowforge.server.views import GATE_TYPE, DefinitionView

# what a node's or compensator's entry costs beside its text: a tuple and three strings
ENTRY_OVERHEAD_BYTES: Final = 220


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# a string as JSON, as json.dumps writes it, without an encoder per call (20,000 per graph)
_text: Callable[[str], str] = encode_basestring


class GraphSkeleton:
    """A definition's graph, serialised up to the states and the rollback's order."""

    def __init__(self, definition: DefinitionView) -> None:
        spec = definition.spec
        levels = definition.levels
        # (key, the node's JSON before its state, after it up to its closing brace)
        self.nodes = [
            (
                task.key,
                f'{{"id":{_text(task.key)},"type":{_text(task.type or GATE_TYPE)},"state":',
                f',"level":{levels[task.key]}' + (',"forEach":true' if task.for_each else ""),
            )
            for task in spec.forward_tasks
        ]
        self.compensators = [
            (
                compensator.key,
                f'{{"id":{_text(compensator.key)},"task":{_text(task)},'
                f'"type":{_text(compensator.type or GATE_TYPE)},"state":',
                "}",
            )
            for task, compensator in spec.compensators.items()
        ]
        self._edges = _json(
            [[upstream, task.key] for task in spec.forward_tasks for upstream in task.depends_on]
        )
        self._levels = definition.level_count
        self._identity = f'"workflow":{_json(spec.workflow)},"version":{spec.version}'
        self.planned_rollback: tuple[str, ...] = tuple(definition.planned_rollback)
        # the bytes it holds, estimated (what a cache weighs it by)
        self.size = (
            sum(
                len(key) + len(before) + len(after) + ENTRY_OVERHEAD_BYTES
                for key, before, after in (*self.nodes, *self.compensators)
            )
            + len(self._edges)
            + sum(len(key) for key in self.planned_rollback)
        )

    def render(
        self,
        states: Mapping[str, str] | None,
        rollback: Sequence[str] | None,
        reasons: Mapping[str, str] | None = None,
    ) -> bytes:
        """The graph with ``states`` (a task without one is ``null``), the ``reasons`` of the
        tasks skipped when the run was created, and the compensators in ``rollback`` order
        (the planned order when None)."""
        found = states or {}
        # a handful of distinct states: each encoded once
        encoded: dict[str | None, str] = {value: _json(value) for value in set(found.values())}
        encoded[None] = "null"
        why = {key: f',"reason":{_text(reason)}}}' for key, reason in (reasons or {}).items()}
        nodes = ",".join(
            [
                f"{before}{encoded[found.get(key)]}{after}{why.get(key, '}')}"
                for key, before, after in self.nodes
            ]
        )
        compensators = ",".join(
            [
                f"{before}{encoded[found.get(key)]}{after}"
                for key, before, after in self.compensators
            ]
        )
        order = _json(list(self.planned_rollback if rollback is None else rollback))
        return (
            f'{{"nodes":[{nodes}],"edges":{self._edges},"rollback":{order},'
            f'"levels":{self._levels},"compensators":[{compensators}],{self._identity}}}'
        ).encode()
