"""Argo CD's health checks and actions for FlowForge (charts/flowforge/argocd/), run in gopher-lua
(the Lua VM Argo CD embeds, from the Go module proxy) against the recorded status bodies
of every phase (tests/data/status/)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.tools.argocd_files import (
    CONFIG_MAP,
    HEADER,
    ROOT,
    SOURCE,
    config_map,
    customizations,
    lua_files,
)
from tests.tools.go_tools import argocd_lua
from tests.tools.status_bodies import EXPECTED, recorded

RUN = SOURCE / "flowforge.io" / "WorkflowRun"
DEFINITION = SOURCE / "flowforge.io" / "WorkflowDefinition"
TEMPLATE = ROOT / "charts/flowforge/templates/argocd-cm.yaml"


def _of(kind: str) -> dict[str, dict[str, Any]]:
    return {stem: obj for stem, obj in recorded().items() if obj["kind"] == kind}


def _results(script: Path, objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = argocd_lua(script, objects.values())
    assert all("error" not in line for line in out), out
    return {stem: line["result"] for stem, line in zip(objects, out, strict=True)}


def test_the_argocd_cm_keys_are_made_from_the_charts_lua_files_their_one_source() -> None:
    elsewhere = [
        str(path.relative_to(ROOT))
        for top in ("charts", "deploy", "docs", "examples")
        for path in (ROOT / top).rglob("*.lua")
        if not path.is_relative_to(SOURCE)
    ]
    assert elsewhere == [], "the chart's argocd/ is the one place for Argo CD's Lua"
    committed = CONFIG_MAP.read_text()
    assert committed.startswith(HEADER)
    assert yaml.safe_load(committed) == config_map(), "run: python -m tests.tools.argocd_files"
    # the chart's template renders every script, under the key the pasted file uses
    template = TEMPLATE.read_text()
    assert set(re.findall(r'Get "argocd/([^"]+)"', template)) == set(lua_files())
    assert set(re.findall(r"^  (resource\.customizations\.[^:]+):", template, re.M)) == set(
        customizations()
    )
    actions = yaml.safe_load(
        customizations()["resource.customizations.actions.flowforge.io_WorkflowRun"]
    )
    assert [d["name"] for d in actions["definitions"]] == ["cancel", "retry"]


def test_every_recorded_run_and_definition_gets_its_expected_health() -> None:
    runs, definitions = _of("WorkflowRun"), _of("WorkflowDefinition")
    health = {
        **_results(RUN / "health.lua", runs),
        **_results(DEFINITION / "health.lua", definitions),
    }
    assert {stem: h["status"] for stem, h in health.items()} == {
        stem: verdict.argocd for stem, verdict in EXPECTED.items()
    }
    for stem, obj in runs.items():
        status = obj.get("status") or {}
        plain = (
            "deletionTimestamp" not in obj["metadata"]
            and status.get("observedGeneration", obj["metadata"]["generation"])
            == obj["metadata"]["generation"]
        )
        if status and plain:  # the run's own message, as kubectl shows it
            assert health[stem]["message"] == status["message"], stem
    assert health["run-pending"]["message"] == "waiting for the FlowForge operator to take the run"
    assert "rolling back" in health["run-deleting"]["message"]
    assert health["definition-refused"]["message"].startswith("not published: version 1")


def test_cancel_is_offered_while_a_run_goes_on_and_retry_once_it_failed() -> None:
    offered = {
        stem: sorted(name for name, action in actions.items() if not action["disabled"])
        for stem, actions in _results(RUN / "actions/discovery.lua", _of("WorkflowRun")).items()
    }
    assert offered == {
        "run-pending": ["cancel"],
        "run-queued": ["cancel"],
        "run-running": ["cancel"],
        "run-awaiting-approval": ["cancel"],
        "run-paused": ["cancel"],
        "run-finalizing": ["cancel"],
        "run-admitting": ["cancel"],
        "run-compensating": ["cancel"],
        "run-cancelling": [],
        "run-cancel-unobserved": [],
        "run-succeeded": [],
        "run-failed": ["retry"],
        "run-failed-halted": ["retry"],
        "run-cancelled": ["retry"],
        "run-refused": [],  # the store never took it: nothing to retry
        "run-deleting": [],
    }


def test_the_cancel_action_sets_spec_cancel_and_changes_nothing_else() -> None:
    running = recorded()["run-running"]
    [patched] = _results(RUN / "actions/cancel/action.lua", {"r": running}).values()
    assert patched["spec"] == {**running["spec"], "cancel": True}
    assert patched["metadata"] == running["metadata"]


def test_the_retry_action_creates_a_run_that_retries_this_one_with_its_parameters() -> None:
    failed = recorded()["run-failed"]
    [impacted] = _results(RUN / "actions/retry/action.lua", {"f": failed}).values()
    [create] = impacted
    assert create["operation"] == "create"
    run = create["resource"]
    assert (run["apiVersion"], run["kind"]) == (failed["apiVersion"], "WorkflowRun")
    assert re.fullmatch(r"order-1001-retry-\d{14}", run["metadata"]["name"])
    assert run["metadata"]["namespace"] == failed["metadata"]["namespace"]
    assert run["spec"] == {
        "workflow": "order",
        "version": 1,
        "parameters": {"orderId": "1001"},
        "retryOf": "order-1001",
    }
