"""Watch events of a WorkflowDefinition whose generation the operator already judged cost no
parse and no write (issue 24): a tenant's annotation loop over a published 10,000-task
definition (0.35-0.45 s of CPU per parse) does nothing. The status is the operator's own and
says which generation it judged; a published one counts only while the store holds that
fingerprint. A parse, when there is one, runs on a thread, not on the event loop."""

from __future__ import annotations

import copy
import threading
import uuid
from typing import Any

import pytest

from flowforge.domain.api import NOT_PUBLISHED
from flowforge.domain.models import DefinitionSpec
from flowforge.operator import publishing
from flowforge.operator.publishing import publish_event
from flowforge.store.definitions import list_versions
from tests.engine.conftest import NAMESPACE, Harness

pytestmark = pytest.mark.store

TASKS = 10_000


def stored_object(*, description: str = "") -> dict[str, Any]:
    """A WorkflowDefinition of ``TASKS`` tasks as the apiserver stores it (generation 1)."""
    return {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowDefinition",
        "metadata": {
            "namespace": NAMESPACE,
            "name": "wide-v1",
            "uid": str(uuid.uuid4()),
            "generation": 1,
        },
        "spec": {
            "workflow": "wide",
            "version": 1,
            "description": description,
            "taskTypes": {"py": {"image": "python:3.12-slim"}},
            "tasks": [{"key": f"t{index}", "type": "py"} for index in range(TASKS)],
        },
    }


class Parses:
    """Counts the operator's parses of a definition, and where they ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[threading.Thread] = []
        parse = publishing.parse_definition

        def counted(spec: Any) -> DefinitionSpec:
            self.threads.append(threading.current_thread())
            return parse(spec)

        monkeypatch.setattr(publishing, "parse_definition", counted)


async def event(harness: Harness, body: dict[str, Any]) -> None:
    """The watch event, then the status patch applied to the object (as the apiserver does)."""
    patches = len(harness.kube.definition_status_patches)
    await publish_event(
        copy.deepcopy(body),
        pool=harness.pool,
        kube=harness.kube,
        namespace_uid=harness.kube.namespace_uid,
    )
    for _, _, status in harness.kube.definition_status_patches[patches:]:
        body["status"] = {**body.get("status", {}), **status}


async def published(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> tuple[Parses, Any]:
    """The parses counted from now on, and the object after its first event published it."""
    parses = Parses(monkeypatch)
    body = stored_object()
    await event(harness, body)
    assert len(parses.threads) == 1
    assert body["status"]["message"] == "published"
    return parses, body


async def test_an_annotation_change_of_a_published_definition_is_not_parsed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    parses, body = await published(harness, monkeypatch)
    assert parses.threads[0] is not threading.main_thread()  # off the event loop
    assert body["status"]["taskCount"] == TASKS
    assert await list_versions(harness.pool, namespace=NAMESPACE, workflow="wide") == [1]

    for loop in range(20):  # the tenant's annotation loop; a resync sends the same object
        body["metadata"]["annotations"] = {"example.com/loop": str(loop)}
        await event(harness, body)
    assert len(parses.threads) == 1
    assert len(harness.kube.definition_status_patches) == 1


async def test_a_refused_generation_is_judged_once_and_a_new_one_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    parses, body = await published(harness, monkeypatch)
    body["spec"]["description"] = "other content under the published version"
    body["metadata"]["generation"] = 2  # the apiserver counts a spec change
    await event(harness, body)
    assert len(parses.threads) == 2
    assert body["status"]["observedGeneration"] == 2
    assert body["status"]["message"].startswith(NOT_PUBLISHED)
    patches = len(harness.kube.definition_status_patches)

    body["metadata"]["labels"] = {"example.com/touched": "yes"}
    await event(harness, body)
    assert len(parses.threads) == 2
    assert len(harness.kube.definition_status_patches) == patches


async def test_a_status_claiming_a_fingerprint_the_store_lacks_is_judged_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    parses, body = await published(harness, monkeypatch)
    elsewhere = copy.deepcopy(body)  # e.g. a store emptied, or an object restored elsewhere
    elsewhere["metadata"]["namespace"] = "team-b"
    await event(harness, elsewhere)
    assert len(parses.threads) == 2
    assert await list_versions(harness.pool, namespace="team-b", workflow="wide") == [1]
