"""An in-memory DefinitionRegistry and builders of admission requests, for the decisions'
unit tests. Admission only reads the registry; `publish` and `persist` stand in for the
operator and the apiserver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flowforge.admission.review import AdmissionRequest, PersistedDefinition
from flowforge.domain.validation import parse_definition

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

    async def persisted(self, *, namespace: str, workflow: str) -> Sequence[PersistedDefinition]:
        return self.objects.get((namespace, workflow), [])

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
