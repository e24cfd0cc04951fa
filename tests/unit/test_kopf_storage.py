"""kopf keeps no diff base for the operator's objects: every handler is an event handler."""

from __future__ import annotations

import kopf
import pytest

import flowforge.operator.handlers as handlers

RUN = {
    "apiVersion": "flowforge.io/v1alpha1",
    "kind": "WorkflowRun",
    "metadata": {"name": "r", "annotations": {"a": "b"}},
    "spec": {"workflow": "w"},
    "status": {"tasks": [{"name": f"t{n}", "state": "Succeeded"} for n in range(50)]},
}


def test_the_operator_registers_only_event_handlers() -> None:
    """The empty essence is right only while kopf has no change or spawning handler (which
    would diff it): one added must set kopf's diff-base storage back."""
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == []
    assert registry._spawning.get_all_handlers() == []
    assert {handler.fn.__name__ for handler in registry._watching.get_all_handlers()} == {
        "job_event",
        "pod_event",
        "run_event",
        "definition_event",
        "policy_event",
        "schedule_event",
        "action_event",
    }


def test_no_essence_is_built_or_stored() -> None:
    storage = handlers.NoDiffBase()
    body = kopf.Body(RUN)
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None
    with pytest.raises(RuntimeError, match="change handler"):
        storage.store(body=body, patch=kopf.Patch(), essence=kopf.BodyEssence())


def test_the_apiserver_sends_only_flowforges_jobs_and_pods() -> None:
    """Pods in every phase: a running Pod's changed files annotation fails its attempt."""
    settings = kopf.OperatorSettings()
    handlers.select_on_the_server(settings)

    def resource(group: str, plural: str, kind: str) -> kopf.Resource:
        return kopf.Resource(group=group, version="v1", plural=plural, kind=kind, namespaced=True)

    def selectors(target: kopf.Resource) -> tuple[list[str], list[str]]:
        return (
            list(settings.watching.label_selectors.collect(target)),
            list(settings.watching.field_selectors.collect(target)),
        )

    own = "app.kubernetes.io/managed-by=flowforge"
    assert selectors(resource("", "pods", "Pod")) == ([own], [])
    assert selectors(resource("batch", "jobs", "Job")) == ([own], [])
    assert selectors(resource("", "configmaps", "ConfigMap")) == ([], [])
