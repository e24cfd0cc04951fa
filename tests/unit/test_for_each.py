"""``forEach`` (``domain/for_each.py``): validation, the instances a run gets, their keys,
the graph around them, the fingerprint and ``flowforge plan -p``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.admission.review import decide_run_limits
from flowforge.domain.caps import MAX_ITEMS_PER_TASK
from flowforge.domain.expansion import expand
from flowforge.domain.for_each import (
    ItemsError,
    instance_key,
    item_key,
    split_instance,
    tolerated_failures,
)
from flowforge.domain.models import ForEachSpec
from flowforge.domain.planning import plan
from flowforge.domain.projection import TaskCounts
from flowforge.domain.states import TaskRole
from flowforge.domain.validation import parse_definition, validate_spec
from flowforge.kube.jobs import (
    ANNOTATION_TASK_KEY,
    LABEL_ITEM,
    SIMULATE_EXIT_CODE,
    SIMULATE_FAIL_ITEMS,
    ItemRef,
    JobIdentity,
    JobRequest,
    build_job,
)
from flowforge.sdk import task as sdk_task
from flowforge.sdk import task_item, workflow
from tests.support.cli import flowforge
from tests.unit.admission_fakes import create, wrap
from tests.unit.domain_builders import spec, succeeded_status
from tests.unit.domain_builders import task as spec_task

PARAMETERS: list[dict[str, Any]] = [
    {"name": "regions", "type": "array", "items": {"type": "string"}, "default": ["eu", "us"]},
    {"name": "targets", "type": "array", "items": {"type": "object"}, "default": []},
    {"name": "mode", "type": "string", "default": "full"},
]


def deploy(**for_each: Any) -> dict[str, Any]:
    """migrate -> deploy (forEach) -> verify; undo-deploy compensates deploy."""
    return spec(
        spec_task("migrate"),
        spec_task("deploy", "migrate", forEach={"items": "params.regions", **for_each}),
        spec_task("verify", "deploy"),
        spec_task("undo-deploy", compensateFor="deploy"),
        parameters=PARAMETERS,
    )


def errors_of(document: dict[str, Any]) -> dict[str, str]:
    return {error.path: error.message for error in validate_spec(document)}


def test_each_item_is_an_instance_and_dependents_wait_for_all() -> None:
    definition = parse_definition(deploy(maxParallel=2))
    expansion = expand(definition, {"regions": ["eu-west-1", "us", "ap"]})
    instances = ["deploy[eu-west-1]", "deploy[us]", "deploy[ap]"]
    assert expansion.groups == {"deploy": tuple(instances)}
    assert expansion.dependencies == {
        "migrate": (),
        **dict.fromkeys(instances, ("migrate",)),
        "verify": tuple(instances),
    }
    assert expansion.instances["deploy[us]"].item == "us"
    assert expansion.instances["deploy[ap]"].position == 2
    assert expansion.levels() == [["migrate"], sorted(instances), ["verify"]]
    assert definition.task_of("deploy[us]").key == "deploy"
    assert definition.task_of("verify").key == "verify"


def test_item_keys_are_the_value_when_plain_else_a_stable_hash() -> None:
    assert item_key("eu-west-1") == "eu-west-1"
    assert item_key(7) == "7"
    for odd in ("EU", "a b", "x" * 33, "", -1, 1.5, True, None, {"a": 1}, ["a"]):
        key = item_key(odd)
        assert key.startswith("h-") and len(key) == 14, odd
        assert item_key(odd) == key
    assert item_key({"a": 1, "b": 2}) == item_key({"b": 2, "a": 1})
    assert split_instance(instance_key("deploy", "us")) == ("deploy", "us")
    assert split_instance("deploy") == ("deploy", None)


def test_object_items_are_named_by_their_key_field() -> None:
    definition = parse_definition(
        spec(
            spec_task("deploy", forEach={"items": "params.targets", "key": "name"}),
            parameters=PARAMETERS,
        )
    )
    expansion = expand(
        definition, {"targets": [{"name": "eu", "size": 3}, {"name": "Big One", "size": 1}]}
    )
    keys = list(expansion.groups["deploy"])
    assert keys[0] == "deploy[eu]" and keys[1].startswith("deploy[h-")
    assert expansion.instances[keys[1]].item == {"name": "Big One", "size": 1}
    with pytest.raises(ItemsError) as missing:
        expand(definition, {"targets": [{"size": 3}]})
    assert missing.value.path == "spec.tasks[0].forEach.items"
    assert "has no field 'name'" in str(missing.value)


def test_duplicate_item_keys_are_refused_naming_the_field() -> None:
    definition = parse_definition(deploy())
    with pytest.raises(ItemsError) as twice:
        expand(definition, {"regions": ["eu", "us", "eu"]})
    assert twice.value.path == "spec.tasks[1].forEach.items"
    assert "items 0 and 2 have the same key 'eu'" in str(twice.value)
    assert errors_of(spec(spec_task("a", forEach={"items": ["x", "x"]}))) == {
        "spec.tasks[0].forEach.items": "items 0 and 1 have the same key 'x'; item keys must be "
        "unique"
    }


def test_items_are_capped_per_task_and_per_run() -> None:
    definition = parse_definition(deploy())
    regions = [f"r{index}" for index in range(MAX_ITEMS_PER_TASK + 1)]
    with pytest.raises(ItemsError, match=f"at most {MAX_ITEMS_PER_TASK} per task"):
        expand(definition, {"regions": regions})
    assert len(expand(definition, {"regions": regions[:-1]}).instances) == MAX_ITEMS_PER_TASK
    huge = spec(
        *(spec_task(f"t{index}", forEach={"items": list(range(250))}) for index in range(41)),
    )
    with pytest.raises(ItemsError, match="at most 10000"):
        expand(parse_definition(huge), {})
    with pytest.raises(ItemsError, match="bytes as JSON"):
        expand(definition, {"regions": ["x" * 5000]})


@pytest.mark.parametrize(
    ("task", "path", "message"),
    [
        (
            spec_task("a", forEach={"items": "params.regoins"}),
            "spec.tasks[0].forEach.items",
            "unknown parameter regoins",
        ),
        (
            spec_task("a", forEach={"items": "params.mode"}),
            "spec.tasks[0].forEach.items",
            "must be a list, is str",
        ),
        (
            spec_task("a", forEach={"items": "params.regions +"}),
            "spec.tasks[0].forEach.items",
            "not a CEL expression",
        ),
        (
            spec_task("a", forEach={"items": 3}),
            "spec.tasks[0].forEach.items",
            "",
        ),
        (
            spec_task("a", forEach={"items": ["x"], "maxParallel": 0}),
            "spec.tasks[0].forEach.maxParallel",
            "",
        ),
        (
            spec_task("a", forEach={"items": ["x"], "tolerateFailures": "ten"}),
            "spec.tasks[0].forEach.tolerateFailures",
            "",
        ),
        (
            spec_task("a", forEach={"items": ["x"], "tolerateFailures": -1}),
            "spec.tasks[0].forEach.tolerateFailures",
            "",
        ),
    ],
    ids=repr,
)
def test_a_for_each_that_does_not_check_is_refused_with_its_field(
    task: dict[str, Any], path: str, message: str
) -> None:
    errors = errors_of(spec(task, parameters=PARAMETERS))
    assert path in errors, errors
    assert message in errors[path]


def test_a_compensator_takes_no_for_each() -> None:
    document = deploy()
    document["tasks"][3]["forEach"] = {"items": ["a"]}
    assert "no forEach of its own" in errors_of(document)["spec.tasks[3].forEach"]


def test_tolerate_failures_is_a_count_or_a_percent_rounded_down() -> None:
    assert tolerated_failures(ForEachSpec(items=[], tolerate_failures=2), 10) == 2
    assert tolerated_failures(ForEachSpec(items=[], tolerate_failures="25%"), 10) == 2
    assert tolerated_failures(ForEachSpec(items=[], tolerate_failures="100%"), 3) == 3
    assert tolerated_failures(ForEachSpec(items=[]), 3) == 0


def test_the_status_counts_a_tolerated_item_apart_from_the_failed() -> None:
    """``kubectl get`` (the progress column) and the status say what `flowforge describe`
    says of an item that failed within ``tolerateFailures``: no failure of the run."""
    status = succeeded_status(TaskCounts(total=4, succeeded=3, tolerated=1))
    assert (status["counts"]["failed"], status["counts"]["tolerated"]) == (0, 1)
    assert status["progress"] == "3/4 (1 failed within tolerateFailures)"
    assert status["message"] == "3 of 4 tasks succeeded, 1 failed within tolerateFailures"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("False", "NoTaskFailed")


def test_an_empty_list_runs_nothing_and_its_dependents_wait_for_its_upstreams() -> None:
    expansion = expand(parse_definition(deploy()), {"regions": []})
    assert expansion.empty == {"deploy"}
    assert expansion.dependencies == {"migrate": (), "verify": ("migrate",)}


def test_the_fingerprint_covers_for_each() -> None:
    prints = {
        parse_definition(document).fingerprint
        for document in (deploy(), deploy(maxParallel=2), deploy(tolerateFailures="10%"))
    }
    assert len(prints) == 3


def test_the_plan_lists_instances_and_their_compensators() -> None:
    schedule = plan(parse_definition(deploy()), {"regions": ["eu", "us"]})
    assert schedule.levels == (("migrate",), ("deploy[eu]", "deploy[us]"), ("verify",))
    assert dict(schedule.compensation) == {
        "deploy[eu]": "undo-deploy[eu]",
        "deploy[us]": "undo-deploy[us]",
    }


@st.composite
def fanned_dags(draw: st.DrawFn) -> dict[str, Any]:
    """A random DAG some of whose tasks fan out over a random list parameter."""
    size = draw(st.integers(min_value=1, max_value=8))
    keys = [f"t{index}" for index in range(size)]
    tasks, parameters = [], []
    for index, key in enumerate(keys):
        upstreams = draw(st.lists(st.sampled_from(keys[:index]), unique=True)) if index else []
        fields: dict[str, Any] = {}
        if draw(st.booleans()):
            items = draw(
                st.lists(
                    st.one_of(st.text(max_size=6), st.integers(-3, 40), st.booleans()),
                    max_size=5,
                    unique_by=item_key,
                )
            )
            parameters.append({"name": f"p{index}", "type": "array", "default": items})
            fields["forEach"] = {"items": f"params.p{index}"}
        tasks.append(spec_task(key, *upstreams, **fields))
    return spec(*tasks, parameters=parameters or [{"name": "unused", "type": "string"}])


@settings(max_examples=60, deadline=None)
@given(document=fanned_dags())
def test_the_expansion_is_stable_unique_and_dependents_wait_for_every_item(
    document: dict[str, Any],
) -> None:
    definition = parse_definition(document)
    expansion = expand(definition, {})
    assert expand(definition, expansion.parameters) == expansion
    keys = list(expansion.dependencies)
    assert len(keys) == len(set(keys))
    expanded = nx.DiGraph()
    expanded.add_nodes_from(keys)
    expanded.add_edges_from(
        (upstream, key)
        for key, upstreams in expansion.dependencies.items()
        for upstream in upstreams
    )
    for task in definition.forward_tasks:
        members = expansion.groups.get(task.key, (task.key,))
        for upstream in task.depends_on:
            for before in expansion.groups.get(upstream, (upstream,)):
                for member in members:
                    assert nx.has_path(expanded, before, member)
        for member in members:
            assert definition.task_of(member).key == task.key


@pytest.fixture
def deploy_file(tmp_path: Path) -> Path:
    document = {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowDefinition",
        "metadata": {"name": "etl-v3"},
        "spec": deploy(),
    }
    (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(document))
    return tmp_path


def test_plan_prints_the_levels_with_item_keys(deploy_file: Path) -> None:
    result = flowforge("plan", "deploy.yaml", "-p", 'regions=["eu","us"]', cwd=deploy_file)
    assert result.returncode == 0, result.stderr
    assert "level 1: deploy[eu]  deploy[us]" in result.stdout
    assert "deploy[us]  undone by  undo-deploy[us]" in result.stdout
    as_json = flowforge("plan", "deploy.yaml", "-o", "json", cwd=deploy_file)
    assert json.loads(as_json.stdout)["levels"][1] == ["deploy[eu]", "deploy[us]"]
    wide = flowforge("plan", "deploy.yaml", "-o", "wide", cwd=deploy_file).stdout
    assert ["deploy[eu]", "1", "py", "migrate"] in [line.split()[:4] for line in wide.splitlines()]
    twice = flowforge("plan", "deploy.yaml", "-p", 'regions=["eu","eu"]', cwd=deploy_file)
    assert twice.returncode == 1
    assert "spec.tasks[1].forEach.items" in twice.stderr


# --- an instance's Job ----------------------------------------------------------------------


def item_job(
    task_key: str = "deploy[us]",
    *,
    role: TaskRole = TaskRole.FORWARD,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return build_job(
        JobRequest(
            namespace="team-a",
            run_name="etl-1",
            run_uid="uid-1",
            task_key=task_key,
            attempt=1,
            role=role,
            template={"image": "busybox:1.36", "annotations": annotations or {}},
            config={"n": 1},
            item=ItemRef(group="deploy", key="us", json='{"region": "us"}'),
        )
    )


def test_an_instance_job_carries_its_item_and_its_exact_task_key() -> None:
    job = item_job()
    pod = job["spec"]["template"]
    env = {entry["name"]: entry["value"] for entry in pod["spec"]["containers"][0]["env"]}
    assert env["FLOWFORGE_ITEM"] == '{"region": "us"}'
    assert env["FLOWFORGE_ITEM_KEY"] == "us"
    assert env["FLOWFORGE_ITEMS_FILE"] == "/etc/flowforge/items.json"
    assert job["metadata"]["labels"][LABEL_ITEM] == "us"
    assert job["metadata"]["annotations"][ANNOTATION_TASK_KEY] == "deploy[us]"
    assert job["metadata"]["name"].startswith("etl-1-deploy-us-1-")
    identity = JobIdentity.of(job)
    assert identity is not None and identity.task_key == "deploy[us]"
    (volume,) = pod["spec"]["volumes"]
    assert volume["configMap"]["items"] == [
        {"key": "parameters.json", "path": "parameters.json"},
        {"key": "config.deploy.json", "path": "config.json"},
        {"key": "items.deploy.json", "path": "items.json"},
    ]
    plain = build_job(
        JobRequest(
            namespace="team-a",
            run_name="etl-1",
            run_uid="uid-1",
            task_key="verify",
            attempt=1,
            role=TaskRole.FORWARD,
            template={"image": "busybox:1.36"},
        )
    )
    assert ANNOTATION_TASK_KEY not in plain["metadata"]["annotations"]
    assert LABEL_ITEM not in plain["metadata"]["labels"]


def test_simulate_fail_items_fails_only_the_named_forward_items() -> None:
    def exit_code(job: dict[str, Any]) -> str | None:
        return job["spec"]["template"]["metadata"]["annotations"].get(SIMULATE_EXIT_CODE)

    named = {SIMULATE_FAIL_ITEMS: "eu, us"}
    assert exit_code(item_job(annotations=named)) == "1"
    assert exit_code(item_job(annotations={**named, SIMULATE_EXIT_CODE: "7"})) == "7"
    other = {SIMULATE_FAIL_ITEMS: "ap", SIMULATE_EXIT_CODE: "7"}
    assert exit_code(item_job(annotations=other)) is None
    compensating = item_job("undo-deploy[us]", role=TaskRole.COMPENSATION, annotations=named)
    assert exit_code(compensating) is None
    assert exit_code(item_job(annotations={SIMULATE_EXIT_CODE: "7"})) == "7"


def test_the_sdk_writes_for_each_and_a_task_reads_its_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    document = workflow(
        "deploy",
        version=1,
        task_types={"py": {"image": "python:3.12-slim"}},
        parameters=PARAMETERS,
        body=sdk_task(
            "deploy",
            "py",
            for_each={"items": "params.regions", "maxParallel": 2},
            compensated_by=sdk_task("undo-deploy", "py"),
        ),
    )
    tasks = document["spec"]["tasks"]
    assert tasks[0]["forEach"] == {"items": "params.regions", "maxParallel": 2}
    assert "forEach" not in tasks[1]
    assert task_item() is None
    monkeypatch.setenv("FLOWFORGE_ITEM", '{"region": "us"}')
    assert task_item() == {"region": "us"}


async def test_admission_refuses_a_run_whose_items_break_a_cap_naming_the_field() -> None:
    definition = parse_definition(deploy())
    too_many = [f"r{index}" for index in range(MAX_ITEMS_PER_TASK + 1)]
    run = wrap(
        "WorkflowRun", {"workflow": "etl", "version": 3, "parameters": {"regions": too_many}}
    )
    verdict = await decide_run_limits(create(run), definition=definition, runs=None)
    assert not verdict.allowed and verdict.code == 422
    assert f"spec.tasks[1].forEach.items: gives {len(too_many)} items" in verdict.message
    twice = wrap(
        "WorkflowRun", {"workflow": "etl", "version": 3, "parameters": {"regions": ["a", "a"]}}
    )
    assert (
        "same key 'a'"
        in (await decide_run_limits(create(twice), definition=definition, runs=None)).message
    )
    fine = wrap(
        "WorkflowRun", {"workflow": "etl", "version": 3, "parameters": {"regions": too_many[:3]}}
    )
    assert (await decide_run_limits(create(fine), definition=definition, runs=None)).allowed
