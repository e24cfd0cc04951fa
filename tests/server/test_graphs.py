"""The graph as the API sends it (``server/graphs.py``): pre-serialised JSON that must be
exactly the ``models.Graph`` shape the OpenAPI document promises, with the states and the
rollback's order laid over the cached definition part; and the task briefs of a run with
forEach items and skipped tasks. Pure: no store, no cluster."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest

from flowforge.domain.expansion import condition_false_message
from flowforge.domain.validation import parse_definition
from flowforge.kube.answer_cache import AnswerCache
from flowforge.server import models, views
from flowforge.server.errors import ApiError
from flowforge.server.graphs import GraphSkeleton
from flowforge.server.reads import compensator_row_key
from flowforge.server.views import DefinitionView
from flowforge.store.browse import TaskRow
from flowforge.store.definitions import StoredDefinition


def view(tasks: list[dict[str, Any]], *, workflow: str = "saga", **fields: Any) -> DefinitionView:
    spec = parse_definition(
        {
            "workflow": workflow,
            "version": 2,
            "taskTypes": {"py": {"image": "python:3.12-slim"}, "sh": {"image": "busybox:1.36"}},
            "tasks": [{"type": "py", **task} for task in tasks],
            **fields,
        }
    )
    return DefinitionView(
        StoredDefinition(
            id=1,
            namespace="team-a",
            spec=spec,
            fingerprint=spec.fingerprint,
            published_at=datetime.now(UTC),
        )
    )


SAGA = [
    {"key": "reserve"},
    {"key": "charge", "dependsOn": ["reserve"], "type": "sh"},
    {"key": "ship", "dependsOn": ["charge", "reserve"]},
    {"key": "release", "compensateFor": "reserve"},
    {"key": "refund", "compensateFor": "charge", "type": "sh"},
]


PARAMETERS = [
    {"name": "mode", "type": "string", "default": "incremental"},
    {"name": "regions", "type": "array", "items": {"type": "string"}, "default": []},
]
FANNED = [
    {"key": "migrate", "when": "params.mode == 'full'"},
    {"key": "deploy", "dependsOn": ["migrate"], "forEach": {"items": "params.regions"}},
    {"key": "verify", "dependsOn": ["deploy"]},
    {"key": "undo-deploy", "compensateFor": "deploy"},
]


def test_the_graph_is_the_models_shape_with_states_levels_and_the_planned_rollback() -> None:
    skeleton = GraphSkeleton(view(SAGA))

    sent = skeleton.render({"reserve": "succeeded", "charge": "running"}, None)
    graph = models.Graph.model_validate_json(sent)

    # every field sent survives the round trip (a node's forEach and reason only when set)
    assert json.loads(sent) == graph.model_dump(by_alias=True, mode="json", exclude_unset=True)
    assert [(n.id, n.type, n.state, n.level) for n in graph.nodes] == [
        ("reserve", "py", "succeeded", 0),
        ("charge", "sh", "running", 1),
        ("ship", "py", None, 2),
    ]
    assert sorted(graph.edges) == [("charge", "ship"), ("reserve", "charge"), ("reserve", "ship")]
    assert (graph.levels, graph.workflow, graph.version) == (3, "saga", 2)
    # dependents first: charge's compensator before reserve's
    assert graph.rollback == ["refund", "release"]
    assert {(c.id, c.task, c.type, c.state) for c in graph.compensators} == {
        ("release", "reserve", "py", None),
        ("refund", "charge", "sh", None),
    }


def test_a_request_lays_its_own_states_and_rollback_order_over_the_same_skeleton() -> None:
    skeleton = GraphSkeleton(view(SAGA))

    first = models.Graph.model_validate_json(
        skeleton.render({"release": "failed", "refund": "succeeded"}, ["refund", "release"])
    )
    second = models.Graph.model_validate_json(skeleton.render(None, []))

    assert {c.id: c.state for c in first.compensators} == {
        "release": "failed",
        "refund": "succeeded",
    }
    assert first.rollback == ["refund", "release"]
    assert [n.state for n in second.nodes] == [None, None, None]
    assert second.rollback == []


def test_a_for_each_task_is_one_node_and_a_task_skipped_at_creation_says_why() -> None:
    skeleton = GraphSkeleton(view(FANNED, parameters=PARAMETERS))
    states = {"migrate": "skipped", "deploy[eu]": "succeeded", "deploy[us]": "running"}

    sent = skeleton.render(states, None, {"migrate": "ConditionFalse"})
    graph = models.Graph.model_validate_json(sent)

    assert json.loads(sent) == graph.model_dump(by_alias=True, mode="json", exclude_unset=True)
    assert [(n.id, n.state, n.for_each, n.reason) for n in graph.nodes] == [
        ("migrate", "skipped", False, "ConditionFalse"),
        ("deploy", None, True, None),  # its items' states are keyed deploy[<item key>]
        ("verify", None, False, None),
    ]
    assert sorted(graph.edges) == [("deploy", "verify"), ("migrate", "deploy")]


def test_an_items_brief_names_its_task_and_a_skip_at_creation_its_reason() -> None:
    shaped = view(FANNED, parameters=PARAMETERS)

    def row(key: str, state: str, error: str | None = None) -> TaskRow:
        compensates = key.removeprefix("undo-") if key.startswith("undo-") else None
        return TaskRow(key, compensates, state, 1, 1, None, None, error)

    briefs = views.task_briefs(
        shaped,
        [
            row("migrate", "skipped", condition_false_message("params.mode == 'full'")),
            row("deploy[eu]", "succeeded"),
            row("undo-deploy[eu]", "not_triggered"),
            row("verify", "skipped", "an upstream task failed"),
        ],
        {},
    )

    assert [(b.name, b.type, b.for_each, b.item, b.reason) for b in briefs] == [
        ("migrate", "py", None, None, "ConditionFalse"),
        ("deploy[eu]", "py", "deploy", "eu", None),
        ("verify", "py", None, None, None),  # its message says why
    ]
    assert briefs[1].compensator is not None and briefs[1].compensator.name == "undo-deploy[eu]"
    assert briefs[2].message == "an upstream task failed"
    # the per-task reads find an item's compensator row by its item
    assert compensator_row_key(shaped, "deploy[eu]", name="r") == "undo-deploy[eu]"
    assert compensator_row_key(shaped, "migrate", name="r") is None
    with pytest.raises(ApiError):
        compensator_row_key(shaped, "undo-deploy[eu]", name="r")


def test_keys_and_states_are_json_escaped_not_pasted() -> None:
    skeleton = GraphSkeleton(view([{"key": "a"}]))

    sent = skeleton.render({"a": 'x","state":"y'}, None)

    assert models.Graph.model_validate_json(sent).nodes[0].state == 'x","state":"y'


async def test_the_cache_keeps_the_newest_skeletons_within_its_byte_budget() -> None:
    small = [
        GraphSkeleton(view([{"key": f"t{i}"} for i in range(3)], workflow=f"w{n}"))
        for n in range(3)
    ]
    cache: AnswerCache[str, GraphSkeleton] = AnswerCache(
        budget=small[0].size * 5 // 2, ttl=lambda _: math.inf, size=lambda s: s.size
    )

    async def made(skeleton: GraphSkeleton) -> GraphSkeleton:
        return skeleton

    for number, skeleton in enumerate(small):
        await cache.get(f"f{number}", partial(made, skeleton))
        assert cache.held <= small[0].size * 5 // 2
    assert cache.cached("f0") is None  # three did not fit: the least recently used went
    assert cache.cached("f1") is small[1] and cache.cached("f2") is small[2]
    # one bigger than the whole budget is handed out, and not kept
    big = GraphSkeleton(view([{"key": f"t{i}"} for i in range(10)]))
    assert big.size > small[0].size * 5 // 2
    assert await cache.get("big", partial(made, big)) is big
    assert cache.cached("big") is None
    assert (cache.cached("f1"), cache.cached("f2")) == (small[1], small[2])
    # a fingerprint kept is not made again
    assert await cache.get("f1", partial(made, GraphSkeleton(view([{"key": "a"}])))) is small[1]
