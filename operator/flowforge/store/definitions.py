"""Published definitions: written once per (namespace, workflow, version), by content.

Publishing is atomic and idempotent by content. Two first publishers of the same version
race on the unique index ``flowforge_definition_identity``; ``INSERT ... ON CONFLICT DO
NOTHING`` makes the loser wait for the winner's commit and then read the winner's row, so
every loser ends with a definite answer: the idempotent return (same fingerprint) or a
``DefinitionConflictError`` naming both fingerprints. No explicit locks are taken, so a
publish cannot deadlock. Loading re-validates the stored document and checks that it still
has the fingerprint it was published with.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import datetime

from psycopg.types.json import Jsonb

from flowforge.domain.errors import DefinitionConflictError, InvalidDefinitionError
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.validation import parse_definition
from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import DefinitionNotFoundError, StoredDefinitionInvalidError
from flowforge.store.transaction import in_transaction


@dataclasses.dataclass(frozen=True)
class PublishedDefinition:
    id: int
    namespace: str
    workflow: str
    version: int
    fingerprint: str
    published_at: datetime
    created: bool  # False: the identical content was already published (idempotent return)


@dataclasses.dataclass(frozen=True)
class StoredDefinition:
    id: int
    namespace: str
    spec: DefinitionSpec
    fingerprint: str
    published_at: datetime
    # the uid its namespace had when it was published (None: not recorded, migration 15)
    namespace_uid: str | None = None


async def publish_definition(
    pool: Pool, *, namespace: str, definition: DefinitionSpec, namespace_uid: str | None = None
) -> PublishedDefinition:
    """Publish ``definition`` in ``namespace`` (whose uid, when known, is recorded with it:
    readers show it only while the namespace of that name has this uid, migration 15)."""
    # a 10,000-task definition takes most of a second to fingerprint and lay out: a thread's
    # work, not the event loop's
    document = await asyncio.to_thread(_document, definition)
    fingerprint = definition.fingerprint

    async def decide(connection: Connection) -> PublishedDefinition:
        inserted = await connection.execute(
            """
            INSERT INTO flowforge_definition
                (namespace, workflow, version, fingerprint, document, namespace_uid)
            VALUES (%s, %s, %s, %s, %s, %s)
            ON CONFLICT ON CONSTRAINT flowforge_definition_identity DO NOTHING
            RETURNING id, published_at
            """,
            (
                namespace,
                definition.workflow,
                definition.version,
                fingerprint,
                document,
                namespace_uid,
            ),
        )
        row = await inserted.fetchone()
        if row is not None:
            return PublishedDefinition(
                id=row[0],
                namespace=namespace,
                workflow=definition.workflow,
                version=definition.version,
                fingerprint=fingerprint,
                published_at=row[1],
                created=True,
            )
        existing = await connection.execute(
            "SELECT id, fingerprint, published_at FROM flowforge_definition "
            "WHERE namespace = %s AND workflow = %s AND version = %s",
            (namespace, definition.workflow, definition.version),
        )
        existing_row = await existing.fetchone()
        if existing_row is None:
            raise AssertionError("ON CONFLICT DO NOTHING skipped a row that is not there")
        existing_id, existing_fingerprint, published_at = existing_row
        if existing_fingerprint != fingerprint:
            raise DefinitionConflictError(
                namespace=namespace,
                workflow=definition.workflow,
                version=definition.version,
                existing_fingerprint=existing_fingerprint,
                new_fingerprint=fingerprint,
            )
        return PublishedDefinition(
            id=existing_id,
            namespace=namespace,
            workflow=definition.workflow,
            version=definition.version,
            fingerprint=fingerprint,
            published_at=published_at,
            created=False,
        )

    return await in_transaction(pool, decide)


def _document(definition: DefinitionSpec) -> Jsonb:
    """The definition's stored document, once its fingerprint is known and its graph is
    built (which validates it: nothing cyclic or dangling gets a row)."""
    _ = definition.fingerprint
    definition.graph.topological_order()
    return Jsonb(definition.to_document())


def _revalidate(
    *, namespace: str, workflow: str, version: int, document: object, fingerprint: str
) -> DefinitionSpec:
    if not isinstance(document, dict):
        raise StoredDefinitionInvalidError(
            namespace=namespace, workflow=workflow, version=version, reason="not an object"
        )
    try:
        spec = parse_definition(document)
    except InvalidDefinitionError as error:
        raise StoredDefinitionInvalidError(
            namespace=namespace, workflow=workflow, version=version, reason=str(error)
        ) from error
    if (spec.workflow, spec.version) != (workflow, version):
        raise StoredDefinitionInvalidError(
            namespace=namespace,
            workflow=workflow,
            version=version,
            reason=f"the document names {spec.workflow} v{spec.version}",
        )
    if spec.fingerprint != fingerprint:
        raise StoredDefinitionInvalidError(
            namespace=namespace,
            workflow=workflow,
            version=version,
            reason=f"its content has fingerprint {spec.fingerprint}, "
            f"it was published as {fingerprint}",
        )
    return spec


def _stored(
    namespace: str, row: tuple[int, str, int, str, object, datetime, str | None]
) -> StoredDefinition:
    definition_id, workflow, version, fingerprint, document, published_at, namespace_uid = row
    spec = _revalidate(
        namespace=namespace,
        workflow=workflow,
        version=version,
        document=document,
        fingerprint=fingerprint,
    )
    return StoredDefinition(
        id=definition_id,
        namespace=namespace,
        spec=spec,
        fingerprint=fingerprint,
        published_at=published_at,
        namespace_uid=namespace_uid,
    )


_SELECT = (
    "SELECT id, workflow, version, fingerprint, document, published_at, namespace_uid "
    "FROM flowforge_definition "
)
LOAD_QUERY = _SELECT + "WHERE namespace = %s AND workflow = %s AND version = %s"
LOAD_NEWEST_QUERY = _SELECT + "WHERE namespace = %s AND workflow = %s ORDER BY version DESC LIMIT 1"


async def load_definition(
    pool: Pool, *, namespace: str, workflow: str, version: int | None = None
) -> StoredDefinition:
    """The definition ``version`` (the newest when None), re-validated on the way out."""
    async with pool.connection() as connection:
        if version is None:
            cursor = await connection.execute(LOAD_NEWEST_QUERY, (namespace, workflow))
        else:
            cursor = await connection.execute(LOAD_QUERY, (namespace, workflow, version))
        row = await cursor.fetchone()
    if row is None:
        raise DefinitionNotFoundError(namespace=namespace, workflow=workflow, version=version)
    return _stored(namespace, row)


async def load_definition_by_id(pool: Pool, definition_id: int) -> StoredDefinition:
    async with pool.connection() as connection:
        return await load_definition_by_id_on(connection, definition_id)


async def load_definition_by_id_on(connection: Connection, definition_id: int) -> StoredDefinition:
    """As ``load_definition_by_id``, on the caller's connection (inside its transaction)."""
    return (await definition_text_by_id_on(connection, definition_id)).parsed()


@dataclasses.dataclass(frozen=True)
class DefinitionText:
    """A stored definition as the store sends it: its document still JSON text, so a reader
    can weigh it (``len(document)``) and parse it where it likes (off its event loop)."""

    id: int
    namespace: str
    workflow: str
    version: int
    fingerprint: str
    document: str
    published_at: datetime
    namespace_uid: str | None

    def parsed(self) -> StoredDefinition:
        """The definition, re-validated (CPU-heavy for a large one)."""
        return _stored(
            self.namespace,
            (
                self.id,
                self.workflow,
                self.version,
                self.fingerprint,
                json.loads(self.document),
                self.published_at,
                self.namespace_uid,
            ),
        )


async def definition_text_by_id_on(connection: Connection, definition_id: int) -> DefinitionText:
    cursor = await connection.execute(
        "SELECT id, namespace, workflow, version, fingerprint, document::text, published_at, "
        "namespace_uid FROM flowforge_definition WHERE id = %s",
        (definition_id,),
    )
    row = await cursor.fetchone()
    if row is None:
        raise DefinitionNotFoundError(
            namespace="?", workflow=f"definition #{definition_id}", version=None
        )
    return DefinitionText(*row)


FINGERPRINT_QUERY = "SELECT fingerprint FROM flowforge_definition WHERE id = %s"


async def definition_fingerprint(pool: Pool, definition_id: int) -> str:
    """The fingerprint a definition was published with (a cache's key: its content)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(FINGERPRINT_QUERY, (definition_id,))
        row = await cursor.fetchone()
    if row is None:
        raise DefinitionNotFoundError(
            namespace="?", workflow=f"definition #{definition_id}", version=None
        )
    return str(row[0])


async def published_fingerprint(
    pool: Pool, *, namespace: str, workflow: str, version: int
) -> str | None:
    """The fingerprint ``version`` was published with; None when it is not published (the
    document is neither read nor parsed)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT fingerprint FROM flowforge_definition "
            "WHERE namespace = %s AND workflow = %s AND version = %s",
            (namespace, workflow, version),
        )
        row = await cursor.fetchone()
    return None if row is None else str(row[0])


async def list_versions(pool: Pool, *, namespace: str, workflow: str) -> list[int]:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT version FROM flowforge_definition WHERE namespace = %s AND workflow = %s "
            "ORDER BY version",
            (namespace, workflow),
        )
        return [int(version) for (version,) in await cursor.fetchall()]
