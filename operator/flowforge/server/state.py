"""What every request of the server shares: the store's pool, the reviews, the user-token
client, a cache of published definitions (immutable, so cached by id) and one of their
graphs (by fingerprint, ``graphs.py``), both bounded by the bytes they are estimated to
hold, and the threads that parse and serialise large definitions off the event loop."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Final, Protocol

import psycopg
import psycopg_pool

from flowforge.kube.answer_cache import AnswerCache
from flowforge.kube.user_api import UserApi
from flowforge.server.access import Authenticator, Authorizer
from flowforge.server.errors import ApiError
from flowforge.server.graphs import GraphSkeleton
from flowforge.server.limits import OffLoop, StreamSlots
from flowforge.server.views import DefinitionView
from flowforge.store.browse import scoped_reader
from flowforge.store.connection import Connection, Pool
from flowforge.store.definitions import definition_text_by_id_on

# estimated bytes (``DefinitionView.size``, ``GraphSkeleton.size``) each cache may hold
DEFINITION_CACHE_BYTES: Final = 64 * 1024 * 1024
GRAPH_CACHE_BYTES: Final = 16 * 1024 * 1024
# definition details put together at once (each holds its versions' graphs as JSON)
DETAILS_AT_ONCE: Final = 2


class NamespaceReads(Protocol):
    """The server's own reads of the cluster's namespaces (``kube.reviews.ApiReviews``)."""

    async def namespace_uids(self, names: Sequence[str] | None = None) -> dict[str, str]: ...

    def close(self) -> None: ...


def definition_cache(budget: int = DEFINITION_CACHE_BYTES) -> AnswerCache[int, DefinitionView]:
    """Parsed definitions by id (immutable: kept until pushed out)."""
    return AnswerCache(budget=budget, ttl=lambda _: math.inf, size=_size)


def graph_cache(budget: int = GRAPH_CACHE_BYTES) -> AnswerCache[str, GraphSkeleton]:
    """Graph skeletons by definition fingerprint (immutable: kept until pushed out)."""
    return AnswerCache(budget=budget, ttl=lambda _: math.inf, size=_size)


def _size(held: DefinitionView | GraphSkeleton) -> int:
    return held.size


@dataclass
class ServerState:
    pool: Pool
    reviews: NamespaceReads
    authenticator: Authenticator
    authorizer: Authorizer
    user_api: UserApi
    poll_seconds: float = 0.5
    streams: StreamSlots = field(default_factory=StreamSlots)
    definitions: AnswerCache[int, DefinitionView] = field(default_factory=definition_cache)
    graphs: AnswerCache[str, GraphSkeleton] = field(default_factory=graph_cache)
    off_loop: OffLoop = field(default_factory=OffLoop)
    definition_details: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(DETAILS_AT_ONCE)
    )

    async def namespace_uids(self, namespaces: Sequence[str] | None = None) -> dict[str, str]:
        """The uid each of ``namespaces`` (every namespace when None) has now, read from the
        apiserver (never cached: a namespace re-created a moment ago must not be shown its
        predecessor's runs)."""
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
        """The published definition ``definition_id``, read in the caller's transaction and
        parsed off the event loop (once for every request that asks meanwhile)."""
        view = self.definitions.cached(definition_id)
        if view is None:
            text = await definition_text_by_id_on(connection, definition_id)
            view = await self.definitions.get(
                definition_id, lambda: self.off_loop.run(partial(DefinitionView.parse, text))
            )
        return view

    async def graph_skeleton(
        self, connection: Connection, *, definition_id: int, fingerprint: str
    ) -> GraphSkeleton:
        """A definition's graph up to its states, cached by fingerprint, built off the loop."""
        skeleton = self.graphs.cached(fingerprint)
        if skeleton is None:
            view = await self.definition(connection, definition_id)
            skeleton = await self.graphs.get(
                fingerprint, lambda: self.off_loop.run(partial(GraphSkeleton, view))
            )
        return skeleton

    def close(self) -> None:
        self.off_loop.close()
