"""What admission reads about definitions: the store (published) and the apiserver (persisted).

Read-only on both sides: the webhook's database role needs SELECT only, and its Kubernetes
role `list` on workflowdefinitions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from flowforge.admission.review import PersistedDefinition
from flowforge.domain.api import NOT_PUBLISHED
from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.validation import parse_definition
from flowforge.store.connection import Pool
from flowforge.store.definitions import list_versions, load_definition
from flowforge.store.errors import DefinitionNotFoundError

ListDefinitions = Callable[[str], Awaitable[list[dict[str, Any]]]]


def persisted_definitions(
    objects: Sequence[dict[str, Any]], *, workflow: str
) -> list[PersistedDefinition]:
    """The objects of ``workflow`` that are or may become published: not being deleted, and
    not already judged unpublishable by the operator."""
    found: list[PersistedDefinition] = []
    for obj in objects:
        spec, metadata = obj.get("spec") or {}, obj.get("metadata") or {}
        version = spec.get("version")
        if spec.get("workflow") != workflow or type(version) is not int:
            continue
        message = str((obj.get("status") or {}).get("message") or "")
        if metadata.get("deletionTimestamp") or message.startswith(NOT_PUBLISHED):
            continue
        found.append(
            PersistedDefinition(name=str(metadata.get("name")), version=version, spec=spec)
        )
    return found


class StoreDefinitionRegistry:
    """Implements `flowforge.admission.review.DefinitionRegistry` on a store pool and a way
    to list the namespace's WorkflowDefinition objects."""

    def __init__(self, pool: Pool, *, list_definitions: ListDefinitions) -> None:
        self._pool = pool
        self._list_definitions = list_definitions

    async def published_fingerprint(
        self, *, namespace: str, workflow: str, version: int
    ) -> str | None:
        try:
            stored = await load_definition(
                self._pool, namespace=namespace, workflow=workflow, version=version
            )
        except DefinitionNotFoundError:
            return None
        return stored.fingerprint

    async def published_versions(self, *, namespace: str, workflow: str) -> Sequence[int]:
        return await list_versions(self._pool, namespace=namespace, workflow=workflow)

    async def persisted(self, *, namespace: str, workflow: str) -> Sequence[PersistedDefinition]:
        return persisted_definitions(await self._list_definitions(namespace), workflow=workflow)

    async def load_definition(
        self, *, namespace: str, workflow: str, version: int
    ) -> DefinitionSpec | None:
        """The definition a run of that version would run: published, or persisted and about
        to be published; None when neither (or it does not validate)."""
        try:
            stored = await load_definition(
                self._pool, namespace=namespace, workflow=workflow, version=version
            )
        except DefinitionNotFoundError:
            pass
        else:
            return stored.spec
        for other in await self.persisted(namespace=namespace, workflow=workflow):
            if other.version == version:
                try:
                    return parse_definition(other.spec)
                except InvalidDefinitionError:
                    return None
        return None
