"""The store's published-definitions tables, seen through admission's `DefinitionRegistry`."""

from __future__ import annotations

from collections.abc import Sequence

from flowforge.domain.models import DefinitionSpec
from flowforge.store.connection import Pool
from flowforge.store.definitions import list_versions, load_definition, publish_definition
from flowforge.store.errors import DefinitionNotFoundError


class StoreDefinitionRegistry:
    """Implements `flowforge.operator.admission.DefinitionRegistry` on a store pool."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

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

    async def publish(self, *, namespace: str, definition: DefinitionSpec) -> None:
        await publish_definition(self._pool, namespace=namespace, definition=definition)
