"""A definition's DAG as text people can look at: Mermaid flowcharts and Graphviz DOT.

Pure functions of a :class:`DefinitionSpec` and, for a run, a mapping of task key -> state
(forward states such as ``running`` or ``skipped``, compensator states such as
``not_triggered``); each state gets its own colour and is written next to the task's key.
Compensators are drawn in their own shape with a dashed ``undoes`` edge to the task they
undo. Output is deterministic: tasks in topological order (ties by key), edges by
downstream then upstream task.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from flowforge.domain.models import DefinitionSpec

GraphFormat = Literal["mermaid", "dot"]
Direction = Literal["TD", "LR"]
GRAPH_FORMATS: tuple[GraphFormat, ...] = ("mermaid", "dot")
DIRECTIONS: tuple[Direction, ...] = ("TD", "LR")


@dataclass(frozen=True, slots=True)
class StateStyle:
    fill: str
    stroke: str
    text: str
    dashed: bool = False


STATE_STYLES: Mapping[str, StateStyle] = {
    "waiting": StateStyle(fill="#f4f4f5", stroke="#a1a1aa", text="#3f3f46"),
    "not_triggered": StateStyle(fill="#ffffff", stroke="#d4d4d8", text="#a1a1aa", dashed=True),
    "ready": StateStyle(fill="#e0f2fe", stroke="#0284c7", text="#075985"),
    "pending": StateStyle(fill="#ede9fe", stroke="#7c3aed", text="#5b21b6"),
    "running": StateStyle(fill="#fef3c7", stroke="#d97706", text="#92400e"),
    "succeeded": StateStyle(fill="#dcfce7", stroke="#16a34a", text="#14532d"),
    "failed": StateStyle(fill="#fee2e2", stroke="#dc2626", text="#7f1d1d"),
    "skipped": StateStyle(fill="#f4f4f5", stroke="#d4d4d8", text="#71717a", dashed=True),
    "cancelled": StateStyle(fill="#e4e4e7", stroke="#52525b", text="#27272a"),
}
# Mermaid's renderers refuse larger graphs unless configured with a higher maxEdges.
MERMAID_DEFAULT_MAX_EDGES = 500
UNKNOWN_STATE_STYLE = StateStyle(fill="#ffffff", stroke="#71717a", text="#18181b")
_UNSAFE_ID_CHARACTERS = re.compile(r"[^A-Za-z0-9]")


@dataclass(frozen=True, slots=True)
class _Node:
    key: str
    node_id: str
    is_compensator: bool
    state: str | None

    @property
    def label(self) -> str:
        return self.key if self.state is None else f"{self.key} ({self.state})"


@dataclass(frozen=True, slots=True)
class _Layout:
    workflow: str
    version: int
    nodes: tuple[_Node, ...]
    edges: tuple[tuple[str, str], ...]  # (upstream id, downstream id)
    undo_edges: tuple[tuple[str, str], ...]  # (compensator id, forward task id)

    @property
    def states(self) -> tuple[str, ...]:
        """The distinct states shown, in the order they first appear."""
        return tuple(dict.fromkeys(node.state for node in self.nodes if node.state is not None))


def render_graph(
    definition: DefinitionSpec,
    *,
    output_format: GraphFormat,
    direction: Direction = "TD",
    states: Mapping[str, str] | None = None,
) -> str:
    """The graph in ``output_format``; see :func:`to_mermaid` and :func:`to_dot`."""
    if output_format == "mermaid":
        return to_mermaid(definition, direction=direction, states=states)
    if output_format == "dot":
        return to_dot(definition, direction=direction, states=states)
    raise ValueError(f"unknown graph format {output_format!r}; expected one of {GRAPH_FORMATS}")


def edge_count(definition: DefinitionSpec) -> int:
    """The edges a drawing has: every dependency, and one per compensator."""
    dependencies = sum(len(task.depends_on) for task in definition.forward_tasks)
    return dependencies + len(definition.compensators)


def node_ids(definition: DefinitionSpec) -> dict[str, str]:
    """Task key -> the node id used for it: ``t_`` (forward) or ``c_`` (compensator) and the
    key with every character other than a letter or digit turned into ``_``; a clash (which
    valid DNS-1123 keys cannot cause) gets a numeric suffix."""
    forward = [task.key for task in definition.forward_tasks]
    compensators = [task.key for task in definition.tasks if task.compensate_for is not None]
    ids: dict[str, str] = {}
    used: set[str] = set()
    for prefix, keys in (("t_", forward), ("c_", compensators)):
        for key in keys:
            if key in ids:
                continue
            candidate = base = prefix + _UNSAFE_ID_CHARACTERS.sub("_", key)
            suffix = 2
            while candidate in used:
                candidate, suffix = f"{base}_{suffix}", suffix + 1
            ids[key] = candidate
            used.add(candidate)
    return ids


def to_mermaid(
    definition: DefinitionSpec,
    *,
    direction: Direction = "TD",
    states: Mapping[str, str] | None = None,
) -> str:
    """A Mermaid ``flowchart``; compensators are hexagons with a dotted edge to their task."""
    layout = _layout(definition, direction=direction, states=states)
    lines = [f"flowchart {direction}", f"  %% workflow {layout.workflow} version {layout.version}"]
    for node in layout.nodes:
        label = _mermaid_label(node.label)
        shape = f'{{{{"{label}"}}}}' if node.is_compensator else f'["{label}"]'
        lines.append(f"  {node.node_id}{shape}")
    lines.extend(f"  {upstream} --> {downstream}" for upstream, downstream in layout.edges)
    lines.extend(
        f"  {compensator} -.->|undoes| {target}" for compensator, target in layout.undo_edges
    )
    compensator_ids = [node.node_id for node in layout.nodes if node.is_compensator]
    if compensator_ids:
        lines.append("  classDef compensator stroke-dasharray:4 3")
        lines.append(f"  class {','.join(compensator_ids)} compensator")
    for state in layout.states:
        style = STATE_STYLES.get(state, UNKNOWN_STATE_STYLE)
        dash = ",stroke-dasharray:4 3" if style.dashed else ""
        lines.append(
            f"  classDef {_state_class(state)} "
            f"fill:{style.fill},stroke:{style.stroke},color:{style.text}{dash}"
        )
        members = [node.node_id for node in layout.nodes if node.state == state]
        lines.append(f"  class {','.join(members)} {_state_class(state)}")
    return "\n".join(lines) + "\n"


def to_dot(
    definition: DefinitionSpec,
    *,
    direction: Direction = "TD",
    states: Mapping[str, str] | None = None,
) -> str:
    """A Graphviz ``digraph``; compensators are dashed hexagons with a dashed edge to their
    task."""
    layout = _layout(definition, direction=direction, states=states)
    rank = "TB" if direction == "TD" else "LR"
    lines = [
        f"digraph {_dot_string(layout.workflow)} {{",
        f"  label={_dot_string(f'{layout.workflow} version {layout.version}')};",
        "  labelloc=t;",
        f"  rankdir={rank};",
        '  node [shape=box, style="rounded", fontname="Helvetica"];',
        '  edge [fontname="Helvetica"];',
    ]
    for node in layout.nodes:
        attributes = [f"label={_dot_string(node.label)}"]
        styles = ["dashed"] if node.is_compensator else ["rounded"]
        if node.is_compensator:
            attributes.append("shape=hexagon")
        if node.state is not None:
            style = STATE_STYLES.get(node.state, UNKNOWN_STATE_STYLE)
            styles.append("filled")
            if style.dashed and not node.is_compensator:
                styles.append("dashed")
            attributes.extend(
                [
                    f"fillcolor={_dot_string(style.fill)}",
                    f"color={_dot_string(style.stroke)}",
                    f"fontcolor={_dot_string(style.text)}",
                ]
            )
        attributes.insert(1, f"style={_dot_string(','.join(styles))}")
        lines.append(f"  {node.node_id} [{', '.join(attributes)}];")
    lines.extend(f"  {upstream} -> {downstream};" for upstream, downstream in layout.edges)
    lines.extend(
        f'  {compensator} -> {target} [style=dashed, arrowhead=empty, label="undoes"];'
        for compensator, target in layout.undo_edges
    )
    lines.append("}")
    return "\n".join(lines) + "\n"


def _layout(
    definition: DefinitionSpec, *, direction: str, states: Mapping[str, str] | None
) -> _Layout:
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; expected one of {DIRECTIONS}")
    states = dict(states or {})
    unknown = sorted(set(states) - {task.key for task in definition.tasks})
    if unknown:
        raise ValueError(f"states name tasks the definition does not have: {', '.join(unknown)}")
    ids = node_ids(definition)
    order = definition.graph.topological_order()
    position = {key: index for index, key in enumerate(order)}
    compensators = sorted(
        ((forward, task.key) for forward, task in definition.compensators.items()),
        key=lambda pair: position[pair[0]],
    )
    nodes = [_Node(key, ids[key], False, states.get(key)) for key in order]
    nodes.extend(_Node(key, ids[key], True, states.get(key)) for _, key in compensators)
    graph = definition.graph
    edges = tuple(
        (ids[upstream], ids[downstream])
        for downstream in order
        for upstream in sorted(graph.dependencies_of(downstream))
    )
    return _Layout(
        workflow=definition.workflow,
        version=definition.version,
        nodes=tuple(nodes),
        edges=edges,
        undo_edges=tuple((ids[key], ids[forward]) for forward, key in compensators),
    )


def _mermaid_label(text: str) -> str:
    """Text safe inside a quoted Mermaid label: entity codes for what the parser would take."""
    escaped = text.replace("#", "#35;").replace('"', "#quot;")
    escaped = escaped.replace("<", "#lt;").replace(">", "#gt;")
    return " ".join(escaped.split())


def _state_class(state: str) -> str:
    return "state_" + _UNSAFE_ID_CHARACTERS.sub("_", state)


def _dot_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{" ".join(escaped.split())}"'
