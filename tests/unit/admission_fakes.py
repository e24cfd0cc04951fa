"""An in-memory DefinitionRegistry and builders of admission requests, for the decisions'
unit tests. Admission only reads the registry; `publish` and `persist` stand in for the
operator and the apiserver. `FakeAuthorizer` and `checks` stand in for the apiserver's
SubjectAccessReviews and the namespace's policies; `Runs` for the store's runs (retryOf)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from flowforge.admission.access import AccessChecks
from flowforge.admission.review import AdmissionRequest, PersistedDefinition, RetrySource
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.policy import Holdings
from flowforge.domain.validation import parse_definition
from flowforge.kube.access_review import CachedAccessReviewer, UserInfo

NAMESPACE = "team-a"


class InMemoryRegistry:
    def __init__(self) -> None:
        self.published: dict[tuple[str, str, int], str] = {}
        self.objects: dict[tuple[str, str], list[PersistedDefinition]] = {}

    async def published_fingerprint(
        self, *, namespace: str, workflow: str, version: int
    ) -> str | None:
        return self.published.get((namespace, workflow, version))

    async def published_versions(self, *, namespace: str, workflow: str) -> Sequence[int]:
        return [v for (ns, wf, v) in self.published if (ns, wf) == (namespace, workflow)]

    async def persisted(
        self, *, namespace: str, workflow: str, version: int | None = None
    ) -> Sequence[PersistedDefinition]:
        return [
            dataclasses.replace(other, spec=other.spec if other.version == version else None)
            for other in self.objects.get((namespace, workflow), [])
        ]

    def publish(self, spec: Mapping[str, Any], *, namespace: str = NAMESPACE) -> None:
        """What the operator does with a stored object (admission never does it)."""
        definition = parse_definition(spec)
        key = (namespace, definition.workflow, definition.version)
        self.published[key] = definition.fingerprint

    def persist(self, name: str, spec: Mapping[str, Any], *, namespace: str = NAMESPACE) -> None:
        """A WorkflowDefinition object the apiserver stored (maybe not yet published)."""
        entry = PersistedDefinition(name=name, version=spec["version"], spec=spec)
        self.objects.setdefault((namespace, spec["workflow"]), []).append(entry)


def definition_spec(*, version: int = 1, image: str = "python:3.12-slim") -> dict[str, Any]:
    return {
        "workflow": "etl",
        "version": version,
        "taskTypes": {"py": {"image": image}},
        "tasks": [
            {"key": "extract", "type": "py"},
            {"key": "load", "type": "py", "dependsOn": ["extract"]},
        ],
    }


def wrap(kind: str, spec: Any, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": NAMESPACE, **metadata},
        "spec": spec,
    }


def create(obj: Mapping[str, Any], *, dry_run: bool = False) -> AdmissionRequest:
    return AdmissionRequest(
        operation="CREATE", namespace=NAMESPACE, new_object=obj, old_object=None, dry_run=dry_run
    )


def update(old: Mapping[str, Any], new: Mapping[str, Any]) -> AdmissionRequest:
    return AdmissionRequest(
        operation="UPDATE", namespace=NAMESPACE, new_object=new, old_object=old, dry_run=False
    )


ALICE = UserInfo(username="alice", uid="u-1", groups=("devs",), extra=(("team", ("a",)),))


class FakeAuthorizer:
    """Answers SubjectAccessReviews from a set of (user, verb, resource, name)."""

    def __init__(self, *grants: tuple[str, str, str, str]) -> None:
        self.grants = set(grants)
        self.bodies: list[Mapping[str, Any]] = []
        self.fail = False

    async def review(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.bodies.append(body)
        await asyncio.sleep(0)
        if self.fail:
            raise ConnectionError("apiserver down")
        spec, attributes = body["spec"], body["spec"]["resourceAttributes"]
        key = (spec["user"], attributes["verb"], attributes["resource"], attributes.get("name", ""))
        return {"status": {"allowed": key in self.grants}}


def checks(
    authorizer: FakeAuthorizer,
    *,
    policies: list[dict[str, Any]] | None = None,
    stored: DefinitionSpec | None = None,
    holdings: NamespaceHoldings | None = None,
) -> AccessChecks:
    """``holdings``: what the store says the namespace holds (none held by default)."""

    async def list_policies(namespace: str) -> list[dict[str, Any]]:
        return list(policies or [])

    async def load_definition(**_: Any) -> DefinitionSpec | None:
        return stored

    return AccessChecks(
        reviewer=CachedAccessReviewer(authorizer.review),
        list_policies=list_policies,
        load_definition=load_definition,
        holdings=holdings or NamespaceHoldings(),
    )


@dataclasses.dataclass
class NamespaceHoldings:
    """The store's answer about what a namespace holds, and the namespaces asked."""

    held: Holdings = dataclasses.field(default_factory=lambda: Holdings(0, 0))
    error: Exception | None = None
    asked: list[str] = dataclasses.field(default_factory=list)

    async def __call__(self, namespace: str) -> Holdings:
        self.asked.append(namespace)
        if self.error is not None:
            raise self.error
        return self.held


JOBS = ("alice", "create", "jobs", "")
POLICY = {"metadata": {"name": "p"}, "spec": {"serviceAccounts": ["default", "builder"]}}


class Runs:
    def __init__(self, **runs: RetrySource) -> None:
        self.runs = {(NAMESPACE, name): run for name, run in runs.items()}

    async def run_named(self, *, namespace: str, name: str) -> RetrySource | None:
        return self.runs.get((namespace, name))

    async def running_runs(self, *, namespace: str, key: str) -> int:
        return 0


FAILED = RetrySource(phase="Failed", workflow="etl", parameters={"date": "d", "n": "1"})
RUNS = Runs(
    old=FAILED,
    stopped=dataclasses.replace(FAILED, phase="Cancelled"),
    busy=dataclasses.replace(FAILED, phase="Running"),
    done=dataclasses.replace(FAILED, phase="Succeeded"),
    other=dataclasses.replace(FAILED, workflow="billing"),
)
