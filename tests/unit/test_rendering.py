"""The DAG as Mermaid and DOT text, checked by real parsers: Mermaid's own (through node, see
tests/tools/mermaid_parser.py) and pydot's DOT grammar. Every expectation is derived from
the raw spec documents, not from the renderer's own view of the graph."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydot
import pytest
from examples.sdk_pipeline import pipeline

from flowforge.cli.authoring import GraphSource
from flowforge.cli.main import build_parser
from flowforge.domain.manifests import load_documents
from flowforge.domain.models import DefinitionSpec, TaskSpec
from flowforge.domain.rendering import (
    GRAPH_FORMATS,
    Direction,
    edge_count,
    node_ids,
    render_graph,
    to_dot,
    to_mermaid,
)
from flowforge.domain.validation import parse_definition
from flowforge.sdk import chain, chord, group, task, workflow
from tests.support.cli import flowforge
from tests.tools.mermaid_parser import parse_mermaid

pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated - use:DeprecationWarning")
REPOSITORY = Path(__file__).parents[2]
STEP = {"image": "busybox:1.36"}
FORWARD_STATES = ("waiting", "ready", "running", "succeeded", "failed", "skipped", "cancelled")


def example_spec(name: str) -> dict[str, Any]:
    text = (REPOSITORY / "examples" / name).read_text()
    (spec,) = [
        doc["spec"]
        for doc in load_documents(text, source=name)
        if doc["kind"] == ("WorkflowDefinition")
    ]
    return dict(spec)


def hazardous_keys_spec() -> dict[str, Any]:
    """Keys that are Mermaid keywords or start the way edge syntax does (o, x, digits)."""
    body = chain(
        task("end", "step"),
        group(
            task("graph", "step"), task("subgraph", "step"), task("o", "step"), task("x", "step")
        ),
        chord(
            group(task("class", "step"), task("style", "step"), task("click", "step")),
            task("default", "step"),
        ),
        group(task("o-ring", "step"), task("x-ray", "step"), task("1st", "step")),
        task("flowchart", "step", compensated_by=task("call", "step")),
        task("a--b", "step", compensated_by=task("o-undo", "step")),
        task("direction", "step", compensated_by=task("linkstyle", "step")),
    )
    return dict(workflow("end", 1, task_types={"step": STEP}, body=body)["spec"])


def wide_spec() -> dict[str, Any]:
    stages = [
        chord(
            group(*(task(f"s{stage}-b{branch}", "step") for branch in range(8))),
            task(f"s{stage}-join", "step"),
        )
        for stage in range(10)
    ]
    return dict(workflow("wide", 1, task_types={"step": STEP}, body=chain(*stages))["spec"])


@dataclass(frozen=True)
class Case:
    name: str
    spec: dict[str, Any]
    direction: Direction = "TD"
    states: dict[str, str] = field(default_factory=dict)

    @property
    def definition(self) -> DefinitionSpec:
        return parse_definition(self.spec)

    def label(self, key: str) -> str:
        return key if key not in self.states else f"{key} ({self.states[key]})"

    def forward_edges(self) -> set[tuple[str, str]]:
        return {
            (upstream, entry["key"])
            for entry in self.spec["tasks"]
            for upstream in entry.get("dependsOn", [])
        }

    def undo_edges(self) -> set[tuple[str, str]]:
        return {
            (entry["key"], entry["compensateFor"])
            for entry in self.spec["tasks"]
            if "compensateFor" in entry
        }

    def compensator_keys(self) -> set[str]:
        return {entry["key"] for entry in self.spec["tasks"] if "compensateFor" in entry}


def _sdk_pipeline_states() -> dict[str, str]:
    forward = [
        "extract",
        "transform-shard-1",
        "transform-shard-2",
        "transform-shard-3",
        "merge",
        "load-warehouse",
        "load-search",
    ]
    states = dict(zip(forward, FORWARD_STATES, strict=True))
    states.update({"unload-warehouse": "not_triggered", "unload-search": "pending"})
    return states


CASES = [
    Case(
        "saga-during-rollback",
        example_spec("saga-order.yaml"),
        states={
            "reserve": "succeeded",
            "charge": "succeeded",
            "ship": "failed",
            "refund": "running",
            "release": "pending",
        },
    ),
    Case("etl-diamond-left-to-right", example_spec("etl-diamond.yaml"), direction="LR"),
    Case("sdk-pipeline-every-state", dict(pipeline()["spec"]), states=_sdk_pipeline_states()),
    Case("hazardous-keys", hazardous_keys_spec()),
    Case("unknown-state", example_spec("saga-order.yaml"), states={"ship": "mystery-state"}),
    Case("wide-90-tasks", wide_spec(), direction="LR"),
]
CASE_IDS = [case.name for case in CASES]


def odd_keys_definition() -> DefinitionSpec:
    """Keys no valid definition has, built past validation on purpose: rendering must stay
    safe (escaped labels, distinct ids) for any key it is handed."""
    return DefinitionSpec(
        workflow="odd",
        version=1,
        tasks=(
            TaskSpec(key='say "hi" #1 <b>', type="t"),
            TaskSpec(key="a-b", type="t", depends_on=('say "hi" #1 <b>',)),
            TaskSpec(key="a_b", type="t", depends_on=("a-b",)),
            TaskSpec(key="a.b", type="t", compensate_for="a-b"),
        ),
    )


def broken_mermaid_texts() -> dict[str, str]:
    """Near misses the parser must reject, or the checks above would mean nothing."""
    rendered = to_mermaid(parse_definition(hazardous_keys_spec()))
    return {
        "task keys as ids": rendered.replace("t_end", "end"),
        "dangling edge": rendered + "  t_end -->\n",
        "unclosed label": 'flowchart TD\n  a["unclosed --> b\n',
    }


@pytest.fixture(scope="module")
def mermaid_results() -> dict[str, dict[str, Any]]:
    """Every text of this module parsed in one node process (starting Mermaid takes seconds)."""
    texts = {
        case.name: to_mermaid(case.definition, direction=case.direction, states=case.states)
        for case in CASES
    }
    texts["odd keys"] = to_mermaid(odd_keys_definition())
    texts.update(broken_mermaid_texts())
    return dict(zip(texts, parse_mermaid(list(texts.values())), strict=True))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_mermaid_parses_to_exactly_the_definitions_graph(
    case: Case, mermaid_results: dict[str, dict[str, Any]]
) -> None:
    parsed = mermaid_results[case.name]
    assert parsed["ok"], parsed.get("error")
    assert parsed["diagramType"] == "flowchart-v2"
    assert parsed["direction"] == {"TD": "TB", "LR": "LR"}[case.direction]

    all_keys = [entry["key"] for entry in case.spec["tasks"]]
    key_of = {vertex["id"]: vertex["text"].split(" (")[0] for vertex in parsed["vertices"]}
    # no vertex beyond the tasks: a malformed id would have made a stray one
    assert sorted(vertex["text"] for vertex in parsed["vertices"]) == sorted(
        case.label(key) for key in all_keys
    )
    for vertex in parsed["vertices"]:
        is_compensator = key_of[vertex["id"]] in case.compensator_keys()
        assert vertex["shape"] == ("hexagon" if is_compensator else "square"), vertex
        assert ("compensator" in vertex["classes"]) == is_compensator, vertex

    edges = [(key_of[edge["start"]], key_of[edge["end"]], edge) for edge in parsed["edges"]]
    solid = [(start, end) for start, end, edge in edges if edge["stroke"] == "normal"]
    dotted = [(start, end) for start, end, edge in edges if edge["stroke"] == "dotted"]
    assert len(solid) == len(set(solid))
    assert set(solid) == case.forward_edges()
    assert set(dotted) == case.undo_edges()
    assert all(edge["text"] == "undoes" for _, _, edge in edges if edge["stroke"] == "dotted")
    assert len(solid) + len(dotted) == len(edges)


@pytest.mark.parametrize("case", [case for case in CASES if case.states], ids=lambda c: c.name)
def test_mermaid_colours_each_state_with_its_own_defined_class(
    case: Case, mermaid_results: dict[str, dict[str, Any]]
) -> None:
    parsed = mermaid_results[case.name]
    styles_by_state: dict[str, tuple[str, ...]] = {}
    for vertex in parsed["vertices"]:
        key = vertex["text"].split(" (")[0]
        state_classes = [name for name in vertex["classes"] if name.startswith("state_")]
        if key not in case.states:
            assert state_classes == []
            continue
        assert state_classes == ["state_" + case.states[key].replace("-", "_")]
        styles = parsed["classes"][state_classes[0]]  # a class used must also be defined
        assert any(style.startswith("fill:#") for style in styles)
        styles_by_state[case.states[key]] = tuple(styles)
    assert set(styles_by_state) == set(case.states.values())
    assert len(set(styles_by_state.values())) == len(styles_by_state), "states look alike"


def test_mermaid_parser_rejects_what_the_renderer_must_avoid(
    mermaid_results: dict[str, dict[str, Any]],
) -> None:
    for name in broken_mermaid_texts():
        assert not mermaid_results[name]["ok"], name
        assert "Parse error" in mermaid_results[name]["error"]


def test_labels_are_escaped_and_ids_never_clash(
    mermaid_results: dict[str, dict[str, Any]],
) -> None:
    definition = odd_keys_definition()
    ids = node_ids(definition)
    assert ids["a-b"] == "t_a_b"
    assert len(set(ids.values())) == 4
    parsed = mermaid_results["odd keys"]
    assert parsed["ok"], parsed.get("error")
    assert sorted(vertex["text"] for vertex in parsed["vertices"]) == sorted(
        task.key for task in definition.tasks
    )
    assert len(parsed["edges"]) == 3
    graph = pydot.graph_from_dot_data(to_dot(definition))
    assert graph is not None
    labels = {_unquote(node.get("label")) for node in _task_nodes(graph[0])}
    assert labels == {task.key for task in definition.tasks}


# --- DOT -----------------------------------------------------------------------------------


def _unquote(value: Any) -> str:
    text = str(value)
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return text


def _task_nodes(graph: pydot.Dot) -> list[pydot.Node]:
    return [node for node in graph.get_nodes() if node.get_name() not in ("node", "edge", "graph")]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_dot_parses_to_exactly_the_definitions_graph(case: Case) -> None:
    text = to_dot(case.definition, direction=case.direction, states=case.states)
    graphs = pydot.graph_from_dot_data(text)
    assert graphs is not None and len(graphs) == 1, text
    graph = graphs[0]
    assert graph.get_type() == "digraph"
    assert graph.get("rankdir") == {"TD": "TB", "LR": "LR"}[case.direction]

    key_of = {
        node.get_name(): _unquote(node.get("label")).split(" (")[0] for node in _task_nodes(graph)
    }
    all_keys = [entry["key"] for entry in case.spec["tasks"]]
    assert sorted(_unquote(node.get("label")) for node in _task_nodes(graph)) == sorted(
        case.label(key) for key in all_keys
    )
    for node in _task_nodes(graph):
        key = key_of[node.get_name()]
        style = _unquote(node.get("style"))
        assert (node.get("shape") == "hexagon") == (key in case.compensator_keys())
        assert ("filled" in style.split(",")) == (key in case.states)
        if key in case.states:
            assert _unquote(node.get("fillcolor")).startswith("#")

    solid, dashed = set(), set()
    for edge in graph.get_edges():
        pair = (key_of[str(edge.get_source())], key_of[str(edge.get_destination())])
        if edge.get("style") == "dashed":
            assert _unquote(edge.get("label")) == "undoes"
            dashed.add(pair)
        else:
            solid.add(pair)
    assert solid == case.forward_edges()
    assert dashed == case.undo_edges()
    assert len(graph.get_edges()) == len(solid) + len(dashed)


def test_pydot_rejects_broken_dot() -> None:
    rendered = to_dot(parse_definition(example_spec("saga-order.yaml")))
    assert pydot.graph_from_dot_data(rendered) is not None
    assert (
        pydot.graph_from_dot_data(rendered.replace("t_charge -> t_ship;", "t_charge -> ;")) is None
    )


# --- determinism and arguments -------------------------------------------------------------


def test_output_does_not_depend_on_declaration_order() -> None:
    spec = example_spec("etl-diamond.yaml")
    reordered = {**spec, "tasks": list(reversed(spec["tasks"]))}
    for output_format in GRAPH_FORMATS:
        first = render_graph(parse_definition(spec), output_format=output_format)
        second = render_graph(parse_definition(reordered), output_format=output_format)
        assert first == second


def test_bad_arguments_are_refused() -> None:
    definition = parse_definition(example_spec("saga-order.yaml"))
    with pytest.raises(ValueError, match="states name tasks the definition does not have: ghost"):
        to_mermaid(definition, states={"ghost": "running"})
    with pytest.raises(ValueError, match="unknown direction"):
        to_dot(definition, direction="BT")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown graph format"):
        render_graph(definition, output_format="svg")  # type: ignore[arg-type]


# --- the CLI -------------------------------------------------------------------------------


def test_graph_command_prints_the_rendering_of_the_file() -> None:
    definition = parse_definition(example_spec("saga-order.yaml"))
    mermaid = flowforge("graph", "examples/saga-order.yaml", cwd=REPOSITORY)
    assert mermaid.returncode == 0, mermaid.stderr
    assert mermaid.stdout == to_mermaid(definition)
    dot = flowforge(
        "graph",
        "examples/etl-diamond.yaml",
        "--format",
        "dot",
        "--direction",
        "LR",
        cwd=REPOSITORY,
    )
    assert dot.returncode == 0, dot.stderr
    graphs = pydot.graph_from_dot_data(dot.stdout)
    assert graphs is not None and graphs[0].get("rankdir") == "LR"


def test_graph_command_refuses_unclear_or_invalid_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two = (
        (REPOSITORY / "examples" / "saga-order.yaml").read_text()
        + "\n---\n"
        + (REPOSITORY / "examples" / "etl-diamond.yaml").read_text()
    )
    (tmp_path / "two.yaml").write_text(two)
    (tmp_path / "bad.yaml").write_text(
        "kind: WorkflowDefinition\nspec: {workflow: x, version: 1, tasks: []}\n"
    )
    parser = build_parser()
    cases = [
        (["graph", str(tmp_path / "two.yaml")], 2, "holds 2 WorkflowDefinition documents"),
        (["graph", str(tmp_path / "two.yaml"), "--name", "nope"], 2, "holds 0"),
        (["graph", str(tmp_path / "bad.yaml")], 1, "invalid WorkflowDefinition: spec.tasks"),
        (["graph", str(tmp_path / "missing.yaml")], 2, "cannot read the file"),
    ]
    for argv, exit_code, message in cases:
        args = parser.parse_args(argv)
        assert args.handler(args) == exit_code, argv
        captured = capsys.readouterr()
        assert message in captured.err and len(captured.err.strip().splitlines()) == 1
    args = parser.parse_args(["graph", str(tmp_path / "two.yaml"), "--name", "etl"])
    assert args.handler(args) == 0
    assert "t_transform_users" in capsys.readouterr().out


def test_graph_command_colours_states_from_a_source_loader(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The hook a run-based source uses: a loader returning the definition and its states."""
    definition = parse_definition(example_spec("saga-order.yaml"))
    states = {"reserve": "succeeded", "ship": "failed"}

    def load_run(args: argparse.Namespace) -> GraphSource:
        return GraphSource(definition=definition, states=states)

    args = build_parser().parse_args(["graph", "run-1234"])
    args.graph_source_loader = load_run
    assert args.handler(args) == 0
    assert capsys.readouterr().out == to_mermaid(definition, states=states)

    args.graph_source_loader = lambda _: GraphSource(definition, {"ghost": "failed"})
    assert args.handler(args) == 3  # the store disagrees with itself: a system failure
    assert "ghost" in capsys.readouterr().err


def test_graph_command_warns_when_mermaid_renderers_would_refuse_the_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stage = [
        group(*(task(f"s{stage}-b{branch}", "step") for branch in range(16))) for stage in "ab"
    ]
    spec = workflow("big", 1, task_types={"step": STEP}, body=chain(*stage))["spec"]
    definition = parse_definition(spec)
    assert edge_count(definition) == 256
    bigger = parse_definition(
        workflow("big", 1, task_types={"step": STEP}, body=chain(*stage, step_group("c")))["spec"]
    )
    args = build_parser().parse_args(["graph", "big.yaml"])
    for source, warned in ((definition, False), (bigger, True)):
        args.graph_source_loader = lambda _, source=source: GraphSource(source)
        assert args.handler(args) == 0
        captured = capsys.readouterr()
        assert captured.out.startswith("flowchart TD")
        assert ("Mermaid renderers refuse more than 500" in captured.err) == warned
    args = build_parser().parse_args(["graph", "big.yaml", "--format", "dot"])
    args.graph_source_loader = lambda _: GraphSource(bigger)
    assert args.handler(args) == 0
    assert capsys.readouterr().err == ""


def step_group(stage: str) -> Any:
    return group(*(task(f"s{stage}-b{branch}", "step") for branch in range(16)))
