"""What every request of the server shares: the store's pool, the reviews, the user-token
client, a cache of published definitions (immutable, so cached by id) and one of their
graphs (by fingerprint, ``graphs.py``)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import psycopg
import psycopg_pool

from flowforge.kube.reviews import ApiReviews
from flowforge.kube.user_api import UserApi
from flowforge.server.access import Authenticator, Authorizer
from flowforge.server.errors import ApiError
from flowforge.server.graphs import GraphCache, GraphSkeleton
from flowforge.server.limits import StreamSlots
from flowforge.server.views import DefinitionView
from flowforge.store.browse import scoped_reader
from flowforge.store.connection import Connection, Pool
from flowforge.store.definitions import load_definition_by_id_on

MAX_CACHED_DEFINITIONS: Final = 64
NAMESPACES_TTL_SECONDS: Final = 10.0


@dataclass
class ServerState:
    pool: Pool
    reviews: ApiReviews
    authenticator: Authenticator
    authorizer: Authorizer
    user_api: UserApi
    poll_seconds: float = 0.5
    streams: StreamSlots = field(default_factory=StreamSlots)
    _definitions: OrderedDict[int, DefinitionView] = field(default_factory=OrderedDict)
    _namespaces: tuple[float, list[str]] = (0.0, [])
    graphs: GraphCache = field(default_factory=GraphCache)

    async def namespace_uids(self, namespaces: Sequence[str]) -> dict[str, str]:
        """The uid each of ``namespaces`` has now, read from the apiserver (never cached: a
        namespace re-created a moment ago must not be shown its predecessor's runs)."""
        try:
            return await self.reviews.namespace_uids(namespaces)
        except Exception as error:
            raise ApiError(503, f"cannot read the namespaces' uids: {error}") from error

    @asynccontextmanager
    async def reader(
        self, namespaces: Sequence[str], *, namespace_uids: Mapping[str, str] | None = None
    ) -> AsyncIterator[Connection]:
        """A read-only transaction of the store scoped to ``namespaces``, showing only the
        runs and definitions of each as it is now (``namespace_uids``, read when not given);
        the store's failures are 503s."""
        if namespace_uids is None:
            namespace_uids = await self.namespace_uids(namespaces)
        try:
            async with scoped_reader(
                self.pool, namespaces, namespace_uids=namespace_uids
            ) as connection:
                yield connection
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as error:
            raise ApiError(503, f"the store is unavailable: {error}") from error

    async def definition(self, connection: Connection, definition_id: int) -> DefinitionView:
        view = self._definitions.get(definition_id)
        if view is None:
            view = DefinitionView(await load_definition_by_id_on(connection, definition_id))
            self._definitions[definition_id] = view
            while len(self._definitions) > MAX_CACHED_DEFINITIONS:
                self._definitions.popitem(last=False)
        else:
            self._definitions.move_to_end(definition_id)
        return view

    async def graph_skeleton(
        self, connection: Connection, *, definition_id: int, fingerprint: str
    ) -> GraphSkeleton:
        """A definition's graph up to its states, cached by fingerprint."""
        skeleton = self.graphs.get(fingerprint)
        if skeleton is None:
            view = await self.definition(connection, definition_id)
            skeleton = self.graphs.put(fingerprint, GraphSkeleton(view))
        return skeleton

    async def cluster_namespaces(self) -> list[str]:
        """The cluster's namespaces (the server's own read, cached briefly)."""
        at, names = self._namespaces
        if time.monotonic() - at < NAMESPACES_TTL_SECONDS:
            return names
        try:
            names = await self.reviews.namespace_names()
        except Exception as error:
            raise ApiError(503, f"cannot list the cluster's namespaces: {error}") from error
        self._namespaces = (time.monotonic(), names)
        return names
