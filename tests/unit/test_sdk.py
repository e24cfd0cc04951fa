"""flowforge.sdk: chain/group/chord over one DAG primitive, checked against hand-written
dependsOn, and the documents it builds checked by the validators and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flowforge.cli.main import main
from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.manifests import load_documents
from flowforge.domain.models import ContainerTemplate
from flowforge.domain.planning import plan
from flowforge.domain.validation import parse_definition, validate_spec
from flowforge.sdk import CompositionError, Dag, chain, chord, group, task, to_yaml, workflow

REPOSITORY = Path(__file__).parents[2]
STEP = {"image": "busybox:1.36"}


def step(key: str, **options: Any) -> Dag:
    return task(key, "step", **options)


def depends_on(body: Dag, **options: Any) -> dict[str, list[str]]:
    """Task key -> its dependsOn in the built document ([] when it has none), in order."""
    document = workflow("pipeline", 1, task_types={"step": STEP}, body=body, **options)
    return {
        entry["key"]: entry.get("dependsOn", [])
        for entry in document["spec"]["tasks"]
        if "compensateFor" not in entry
    }


def flowforge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "operator")}
    return subprocess.run(
        [sys.executable, "-m", "flowforge.cli.main", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- the constructors, against hand-written dependsOn ------------------------------------


def test_a_single_task_has_no_dependencies() -> None:
    assert depends_on(step("only")) == {"only": []}


def test_chain_links_each_step_to_the_one_before() -> None:
    assert depends_on(chain(step("a"), step("b"), step("c"))) == {
        "a": [],
        "b": ["a"],
        "c": ["b"],
    }


def test_group_branches_are_independent() -> None:
    assert depends_on(group(step("a"), step("b"), step("c"))) == {"a": [], "b": [], "c": []}


def test_a_group_inside_a_chain_makes_a_diamond() -> None:
    assert depends_on(chain(step("a"), group(step("b"), step("c")), step("d"))) == {
        "a": [],
        "b": ["a"],
        "c": ["a"],
        "d": ["b", "c"],
    }


def test_chaining_two_groups_links_every_leaf_to_every_root() -> None:
    assert depends_on(chain(group(step("a"), step("b")), group(step("c"), step("d")))) == {
        "a": [],
        "b": [],
        "c": ["a", "b"],
        "d": ["a", "b"],
    }


def test_chord_callback_waits_for_the_leaves_of_its_body_only() -> None:
    body = group(step("a"), chain(step("b"), step("c")))
    assert depends_on(chord(body, step("done"))) == {
        "a": [],
        "b": [],
        "c": ["b"],
        "done": ["a", "c"],
    }


def test_chord_with_a_chain_body_waits_for_its_last_step() -> None:
    assert depends_on(chord(chain(step("a"), step("b")), step("c"))) == {
        "a": [],
        "b": ["a"],
        "c": ["b"],
    }


def test_deeply_nested_chains_groups_and_chords() -> None:
    body = chain(
        step("start"),
        group(
            chain(step("fetch"), group(step("parse-x"), step("parse-y"))),
            step("audit"),
        ),
        chord(group(step("shard-1"), chain(step("shard-2"), step("shard-2b"))), step("merge")),
        group(step("publish"), chord(step("index"), step("ping"))),
        step("end"),
    )
    assert depends_on(body) == {
        "start": [],
        "fetch": ["start"],
        "parse-x": ["fetch"],
        "parse-y": ["fetch"],
        "audit": ["start"],
        "shard-1": ["audit", "parse-x", "parse-y"],
        "shard-2": ["audit", "parse-x", "parse-y"],
        "shard-2b": ["shard-2"],
        "merge": ["shard-1", "shard-2b"],
        "publish": ["merge"],
        "index": ["merge"],
        "ping": ["index"],
        "end": ["ping", "publish"],
    }


def test_nested_composition_has_the_expected_levels() -> None:
    document = workflow(
        "pipeline",
        1,
        task_types={"step": STEP},
        body=chain(step("a"), chord(group(step("b"), chain(step("c"), step("d"))), step("e"))),
    )
    schedule = plan(parse_definition(document["spec"]))
    assert schedule.levels == (("a",), ("b", "c"), ("d",), ("e",))


def test_nested_chains_and_groups_flatten_to_the_same_graph() -> None:
    nested = chain(chain(step("a"), step("b")), chain(step("c")))
    flat = chain(step("a"), step("b"), step("c"))
    assert depends_on(nested) == depends_on(flat)
    assert depends_on(group(group(step("a")), step("b"))) == {"a": [], "b": []}


def test_the_dag_primitive_exposes_roots_leaves_and_edges() -> None:
    dag = chain(group(step("a"), step("b")), step("c"), group(step("d"), step("e")))
    assert dag.roots == ("a", "b")
    assert dag.leaves == ("d", "e")
    assert set(dag.edges) == {("a", "c"), ("b", "c"), ("c", "d"), ("c", "e")}
    assert dag.keys == ("a", "b", "c", "d", "e")


# --- the document ----------------------------------------------------------------------------


def test_the_document_is_a_valid_workflow_definition_with_every_option() -> None:
    document = workflow(
        "orders",
        7,
        description="Order fulfilment",
        task_types={
            "step": ContainerTemplate(image="busybox:1.36", command=("sh", "-c", "true")),
            "py": {"image": "python:3.12-slim"},
        },
        body=chain(
            step("reserve", compensated_by=step("release")),
            task(
                "charge",
                "py",
                config={"amount": 12, "currency": "EUR"},
                retries=3,
                timeout_seconds=60,
            ),
            step("ship"),
        ),
        compensations={"charge": task("refund", "py", retries=1)},
        metadata_name="orders-seven",
        namespace="shop",
    )
    assert document == {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowDefinition",
        "metadata": {"name": "orders-seven", "namespace": "shop"},
        "spec": {
            "workflow": "orders",
            "version": 7,
            "description": "Order fulfilment",
            "taskTypes": {
                "step": {"image": "busybox:1.36", "command": ["sh", "-c", "true"]},
                "py": {"image": "python:3.12-slim"},
            },
            "tasks": [
                {"key": "reserve", "type": "step"},
                {
                    "key": "charge",
                    "type": "py",
                    "dependsOn": ["reserve"],
                    "config": {"amount": 12, "currency": "EUR"},
                    "retries": 3,
                    "timeoutSeconds": 60,
                },
                {"key": "ship", "type": "step", "dependsOn": ["charge"]},
                {"key": "release", "type": "step", "compensateFor": "reserve"},
                {"key": "refund", "type": "py", "compensateFor": "charge", "retries": 1},
            ],
        },
    }
    assert validate_spec(document["spec"]) == []
    assert dict(plan(parse_definition(document["spec"])).compensation) == {
        "charge": "refund",
        "reserve": "release",
    }


def test_the_same_composition_always_gives_the_same_document_and_yaml() -> None:
    def build() -> dict[str, Any]:
        return workflow(
            "pipeline",
            1,
            task_types={"step": STEP},
            body=chord(group(step("z"), step("y"), step("x")), step("w")),
        )

    first, second = build(), build()
    assert first == second
    assert to_yaml([first]) == to_yaml([second])
    assert [entry["key"] for entry in first["spec"]["tasks"]] == ["z", "y", "x", "w"]
    assert first["spec"]["tasks"][-1]["dependsOn"] == ["x", "y", "z"]


def test_config_is_copied_when_the_task_is_built() -> None:
    config: dict[str, Any] = {"paths": ["a"]}
    dag = step("copy", config=config)
    config["paths"].append("b")
    config["late"] = True
    document = workflow("pipeline", 1, task_types={"step": STEP}, body=dag)
    assert document["spec"]["tasks"][0]["config"] == {"paths": ["a"]}


def test_an_invalid_definition_is_refused_with_the_validators_message() -> None:
    with pytest.raises(InvalidDefinitionError) as caught:
        workflow("pipeline", 1, task_types={"step": STEP}, body=task("Extract", "missing"))
    paths = [error.path for error in caught.value.errors]
    assert paths == ["spec.tasks[0].key"]  # the shape error wins over the unknown type
    assert "Extract" in str(caught.value)


# --- composition errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: chain(step("a"), step("a")),
        lambda: chain(step("a"), group(step("b"), chain(step("c"), step("a")))),
        lambda: chord(group(step("x"), step("a")), step("a")),
        lambda: chain(step("a"), step("undo", compensated_by=step("a"))),
        lambda: step("a", compensated_by=step("a")),
        lambda: group(step("x", compensated_by=step("a")), step("y", compensated_by=step("a"))),
    ],
    ids=[
        "chain",
        "nested-group",
        "chord-callback",
        "compensator-key-is-a-task",
        "compensates-itself",
        "two-compensators-one-key",
    ],
)
def test_a_task_key_used_twice_is_refused_clearly(build: Any) -> None:
    with pytest.raises(CompositionError, match=r'task key "a" is used more than once'):
        build()


def test_a_composition_reused_twice_is_refused() -> None:
    shared = chain(step("p"), step("q"))
    with pytest.raises(CompositionError, match=r'task key "p" is used more than once'):
        group(shared, shared)


def test_compensations_mapping_errors() -> None:
    body = chain(step("a", compensated_by=step("undo-a")), step("b"))
    cases: list[tuple[dict[str, Dag], str]] = [
        ({"ghost": step("undo-ghost")}, r'names "ghost", which is not a task of the body'),
        ({"a": step("undo-a-again")}, r'task "a" already has a compensator \("undo-a"\)'),
        ({"b": step("undo-a")}, r'task key "undo-a" is used more than once'),
        ({"b": step("a")}, r'task key "a" is used more than once'),
        ({"b": chain(step("x"), step("y"))}, r"must be a single task\(...\)"),
    ]
    for compensations, message in cases:
        with pytest.raises(CompositionError, match=message):
            workflow("p", 1, task_types={"step": STEP}, body=body, compensations=compensations)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: chain(), r"chain\(\) needs at least one step"),
        (lambda: group(), r"group\(\) needs at least one step"),
        (lambda: chain(step("a"), "b"), r"chain\(\) argument 2 must be a task"),  # type: ignore[arg-type]
        (lambda: chord(step("a"), ["b"]), r"chord callback must be a task.*not list"),  # type: ignore[arg-type]
        (lambda: task("", "step"), r"task key must be a non-empty string"),
        (lambda: task("a", None), r"task type must be a non-empty string"),  # type: ignore[arg-type]
        (lambda: task("a", "step", config=["x"]), r"config must be a mapping"),  # type: ignore[arg-type]
        (
            lambda: step("a", compensated_by=group(step("b"), step("c"))),
            r'the compensator of "a" must be a single task',
        ),
        (
            lambda: step("a", compensated_by=step("b", compensated_by=step("c"))),
            r"cannot have a compensator itself",
        ),
    ],
)
def test_malformed_compositions_are_refused(build: Any, message: str) -> None:
    with pytest.raises(CompositionError, match=message):
        build()


# --- YAML ----------------------------------------------------------------------------------


def test_yaml_reads_back_as_the_same_json_the_way_kubernetes_reads_it() -> None:
    tricky = [
        "0o17",
        "0x1F",
        "017",
        "1_000",
        "1e3",
        ".5",
        "1:30",
        "yes",
        "on",
        "n",
        "~",
        "null",
        "",
        "true",
        "2026-11-30",
        "-",
        "plain text",
        "#hash",
        "a: b",
        "'q'",
    ]
    document = workflow(
        "pipeline",
        1,
        task_types={"step": STEP},
        body=step("a", config={"values": tricky, **{text or "empty": text for text in tricky}}),
    )
    text = to_yaml([document, document])
    assert load_documents(text, source="rendered") == [document, document]


# --- the CLI -------------------------------------------------------------------------------


def test_rendered_example_passes_flowforge_validate(tmp_path: Path) -> None:
    rendered = flowforge("render", "examples/sdk_pipeline.py:pipeline", cwd=REPOSITORY)
    assert rendered.returncode == 0, rendered.stderr
    manifest = tmp_path / "pipeline.yaml"
    manifest.write_text(rendered.stdout)

    validated = flowforge("validate", str(manifest), cwd=tmp_path)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert validated.stdout.strip() == (f"{manifest}:2: WorkflowDefinition sharded-etl-v1: valid")
    (document,) = load_documents(rendered.stdout, source="rendered")
    assert {
        entry["key"]: entry.get("dependsOn", entry.get("compensateFor"))
        for entry in document["spec"]["tasks"]
    } == {
        "extract": None,
        "transform-shard-1": ["extract"],
        "transform-shard-2": ["extract"],
        "transform-shard-3": ["extract"],
        "merge": ["transform-shard-1", "transform-shard-2", "transform-shard-3"],
        "load-warehouse": ["merge"],
        "load-search": ["merge"],
        "notify": ["load-search", "load-warehouse"],
        "unload-warehouse": "load-warehouse",
        "unload-search": "load-search",
    }


def test_render_imports_a_module_attribute_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "pipelines.py").write_text(
        "from flowforge.sdk import chain, task, workflow\n"
        "etl = workflow('etl', 2, task_types={'py': {'image': 'python:3.12-slim'}},\n"
        "               body=chain(task('extract', 'py'), task('load', 'py')))\n"
        "BOTH = [etl, {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'c'}}]\n"
    )
    as_json = flowforge("render", "pipelines:etl", "-o", "json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["spec"]["tasks"][1] == {
        "key": "load",
        "type": "py",
        "dependsOn": ["extract"],
    }
    both = flowforge("render", "pipelines:BOTH", cwd=tmp_path)
    assert both.returncode == 0, both.stderr
    kinds = [document["kind"] for document in load_documents(both.stdout, source="both")]
    assert kinds == ["WorkflowDefinition", "ConfigMap"]


def test_render_reports_problems_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_defs.py").write_text(
        "BAD = {'apiVersion': 'flowforge.io/v1alpha1', 'kind': 'WorkflowDefinition',\n"
        "       'metadata': {'name': 'x'}, 'spec': {'workflow': 'x', 'version': 0}}\n"
        "NUMBER = 3\n"
        "def explode():\n"
        "    raise RuntimeError('boom')\n"
    )
    cases = [
        (["render", "broken_defs:BAD"], 1, "document 0 is an invalid WorkflowDefinition"),
        (["render", "broken_defs:NUMBER"], 2, "got int"),
        (["render", "broken_defs:explode"], 2, "calling broken_defs:explode failed"),
        (["render", "broken_defs:missing"], 2, "has no attribute 'missing'"),
        (["render", "no_such_module_here:x"], 2, "cannot import no_such_module_here"),
        (["render", "no-colon"], 2, "is not MODULE:ATTR"),
    ]
    for argv, exit_code, message in cases:
        assert main(argv) == exit_code, argv
        captured = capsys.readouterr()
        assert captured.out == ""
        assert message in captured.err
        assert len(captured.err.strip().splitlines()) == 1, captured.err
