"""What the engine knows about a run that never changes: identity, definition, parameters.

A run's definition version is immutable once published, so a run's context is cached for
the life of the process; the store stays the system of record for everything that moves.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from flowforge.domain.api import REQUESTED_BY_ANNOTATION
from flowforge.domain.errors import UserError
from flowforge.domain.execution import job_name, parse_timestamp
from flowforge.domain.states import TaskRole
from flowforge.store.connection import Pool
from flowforge.store.definitions import StoredDefinition, load_definition, load_definition_by_id
from flowforge.store.errors import DefinitionNotFoundError, StoredDefinitionInvalidError
from flowforge.store.lease import Fence
from flowforge.store.queries import find_run_id_by_uid
from flowforge.store.runs import create_run, get_run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunContext:
    run_id: int
    namespace: str
    name: str
    uid: str
    parameters: Mapping[str, Any]
    definition: StoredDefinition

    def job_name(self, *, task_key: str, attempt: int, role: TaskRole = TaskRole.FORWARD) -> str:
        return job_name(
            run_name=self.name, run_uid=self.uid, task_key=task_key, attempt=attempt, role=role
        )


class RunRefusedError(UserError):
    """The run cannot start: its definition is missing or no longer validates."""


class PublishPending(Protocol):
    def __call__(self, *, namespace: str, workflow: str) -> Awaitable[bool]: ...


class RunCache:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        # publishes a workflow's stored but unpublished definitions (set by the operator)
        self.publish_pending: PublishPending | None = None
        self._by_uid: dict[str, RunContext] = {}
        self._by_id: dict[int, RunContext] = {}
        self._definitions: dict[int, StoredDefinition] = {}

    def _remember(self, context: RunContext) -> RunContext:
        self._by_uid[context.uid] = context
        self._by_id[context.run_id] = context
        return context

    async def _definition(self, definition_id: int) -> StoredDefinition:
        cached = self._definitions.get(definition_id)
        if cached is None:
            cached = await load_definition_by_id(self._pool, definition_id)
            self._definitions[definition_id] = cached
        return cached

    async def ensure(self, body: Mapping[str, Any], *, fence: Fence) -> tuple[RunContext, bool]:
        """The run of this WorkflowRun object, created (run and task rows, one transaction)
        when it does not exist yet; True when this call created it."""
        metadata = body["metadata"]
        uid = str(metadata["uid"])
        known = self._by_uid.get(uid)
        if known is not None:
            return known, False
        namespace, name = str(metadata["namespace"]), str(metadata["name"])
        existing = await find_run_id_by_uid(self._pool, namespace=namespace, uid=uid)
        if existing is not None:
            return await self.by_id(existing), False
        spec = body.get("spec") or {}
        try:
            definition = await self._load_definition(namespace, spec)
        except (UserError, StoredDefinitionInvalidError) as error:
            raise RunRefusedError(str(error)) from error
        parameters = dict(spec.get("parameters") or {})
        created = await create_run(
            self._pool,
            fence=fence,
            namespace=namespace,
            name=name,
            uid=uid,
            definition=definition,
            parameters=parameters,
            # admitted: a finished, unsuccessful run of this namespace, same parameters
            retry_of=spec.get("retryOf"),
            requested_by=(metadata.get("annotations") or {}).get(REQUESTED_BY_ANNOTATION),
            priority=int(spec.get("priority") or 0),
            max_parallel_tasks=spec.get("maxParallelTasks"),
            submitted_at=parse_timestamp(metadata.get("creationTimestamp")),
        )
        self._definitions[definition.id] = definition
        context = RunContext(
            run_id=created.run.id,
            namespace=namespace,
            name=name,
            uid=uid,
            parameters=parameters,
            definition=definition,
        )
        return self._remember(context), created.created

    async def _load_definition(self, namespace: str, spec: Mapping[str, Any]) -> StoredDefinition:
        workflow, version = str(spec.get("workflow")), spec.get("version")
        try:
            return await load_definition(
                self._pool, namespace=namespace, workflow=workflow, version=version
            )
        except DefinitionNotFoundError:
            # admitted because its object is stored: its watch event may just not be handled yet
            if self.publish_pending is None or not await self.publish_pending(
                namespace=namespace, workflow=workflow
            ):
                raise
        return await load_definition(
            self._pool, namespace=namespace, workflow=workflow, version=version
        )

    async def by_id(self, run_id: int) -> RunContext:
        known = self._by_id.get(run_id)
        if known is not None:
            return known
        record = await get_run(self._pool, run_id)
        definition = await self._definition(record.definition_id)
        return self._remember(
            RunContext(
                run_id=record.id,
                namespace=record.namespace,
                name=record.name,
                uid=record.uid,
                parameters=dict(record.parameters),
                definition=definition,
            )
        )

    async def by_uid(self, *, namespace: str, uid: str) -> RunContext | None:
        known = self._by_uid.get(uid)
        if known is not None:
            return known
        run_id = await find_run_id_by_uid(self._pool, namespace=namespace, uid=uid)
        return None if run_id is None else await self.by_id(run_id)
