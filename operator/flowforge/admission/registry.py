"""What admission reads about definitions: the store (published) and the apiserver (persisted).

Read-only on both sides: the webhook's database role needs SELECT only, and its Kubernetes
role `list` on workflowdefinitions.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from flowforge.admission.review import PersistedDefinition
from flowforge.domain.api import NOT_PUBLISHED
from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.validation import parse_definition
from flowforge.kube.pages import ListPage, pages
from flowforge.store.connection import Pool
from flowforge.store.definitions import list_versions, load_definition, published_fingerprint
from flowforge.store.errors import DefinitionNotFoundError

# one page of the namespace's WorkflowDefinitions (``KubeClient.list_definitions``)
ListDefinitions = Callable[..., Awaitable[ListPage]]
# objects per LIST page; each page is also bounded in bytes (``kube/pages.py``)
PAGE_SIZE = 100


def persisted_definitions(
    objects: Sequence[dict[str, Any]], *, workflow: str, version: int | None
) -> list[PersistedDefinition]:
    """The objects of ``workflow`` that are or may become published: not being deleted, and
    not already judged unpublishable by the operator; with their spec only when they are of
    ``version``."""
    found: list[PersistedDefinition] = []
    for obj in objects:
        spec, metadata = obj.get("spec") or {}, obj.get("metadata") or {}
        held = spec.get("version")
        if spec.get("workflow") != workflow or type(held) is not int:
            continue
        message = str((obj.get("status") or {}).get("message") or "")
        if metadata.get("deletionTimestamp") or message.startswith(NOT_PUBLISHED):
            continue
        found.append(
            PersistedDefinition(
                name=str(metadata.get("name")),
                version=held,
                spec=spec if held == version else None,
            )
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
        return await published_fingerprint(
            self._pool, namespace=namespace, workflow=workflow, version=version
        )

    async def published_versions(self, *, namespace: str, workflow: str) -> Sequence[int]:
        return await list_versions(self._pool, namespace=namespace, workflow=workflow)

    async def persisted(
        self, *, namespace: str, workflow: str, version: int | None = None
    ) -> Sequence[PersistedDefinition]:
        """The namespace's objects are read in pages, each dropped once the workflow's
        objects are taken from it: a review holds one page and what it keeps, however many
        (and however large) the namespace's other definitions are."""
        found: list[PersistedDefinition] = []
        async for page in pages(
            functools.partial(self._list_definitions, namespace=namespace), limit=PAGE_SIZE
        ):
            found += persisted_definitions(page, workflow=workflow, version=version)
        return found

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
        for other in await self.persisted(namespace=namespace, workflow=workflow, version=version):
            if other.spec is not None:
                try:
                    return parse_definition(other.spec)
                except InvalidDefinitionError:
                    return None
        return None
