"""What the engine knows about a run that never changes: identity, definition, parameters.

Contexts are cached only while their runs are active, keyed by uid and by run id, and
forgotten when a run finishes (``forget``); a finished run's context is built when asked
for and not kept. Definitions are kept in their compact form (``domain/compact.py``) in a
least-recently-used cache keyed by fingerprint, bounded by the tasks it holds; a run's
context keeps its own definition alive, so an active run never loses it. The store stays the
system of record for everything that moves.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cachetools import LRUCache, TTLCache

from flowforge.domain.api import REQUESTED_BY_ANNOTATION
from flowforge.domain.compact import RunDefinition
from flowforge.domain.errors import UserError
from flowforge.domain.execution import job_name, parse_timestamp
from flowforge.domain.expansion import expand
from flowforge.domain.run import CONCURRENCY_FORBIDDEN, DEFINITION_REFUSED, refused_for_good
from flowforge.domain.states import TERMINAL_RUN_PHASES, RunPhase, TaskRole
from flowforge.kube.errors import KubernetesRefusal
from flowforge.store.connection import Pool
from flowforge.store.definitions import (
    StoredDefinition,
    definition_fingerprint,
    load_definition,
    load_definition_by_id,
)
from flowforge.store.errors import (
    ConcurrencyForbiddenError,
    DefinitionNotFoundError,
    StoredDefinitionInvalidError,
)
from flowforge.store.lease import Fence
from flowforge.store.queries import find_run_id_by_uid, find_run_id_by_uid_anywhere
from flowforge.store.runs import create_run, get_run

logger = logging.getLogger(__name__)

# the definitions cache holds at most this many tasks (a 10,000-task definition is ~1 MiB)
DEFINITION_CACHE_TASKS = 200_000
# finished runs whose final phase is remembered (~100 bytes each): the watch events that
# follow a run's end are answered without a store read
REMEMBERED_FINISHED_RUNS = 10_000


@dataclass(frozen=True)
class RunContext:
    run_id: int
    namespace: str
    name: str
    uid: str
    parameters: Mapping[str, Any]
    definition: RunDefinition

    def job_name(self, *, task_key: str, attempt: int, role: TaskRole = TaskRole.FORWARD) -> str:
        return job_name(
            run_name=self.name, run_uid=self.uid, task_key=task_key, attempt=attempt, role=role
        )


@dataclass(frozen=True)
class Sighting:
    """A WorkflowRun object's run: ``created`` by this call; ``finished`` when the store has
    finished it (its context is then not cached)."""

    context: RunContext
    created: bool
    phase: RunPhase | None  # None: an active run already cached

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_RUN_PHASES


class RunRefusedError(UserError):
    """The run cannot start: its definition is missing or no longer validates, or its
    ``Forbid`` workflow's concurrency key is full (``reason``, its conditions' reason)."""

    def __init__(self, message: str, *, reason: str = DEFINITION_REFUSED) -> None:
        super().__init__(message)
        self.reason = reason


class PublishPending(Protocol):
    def __call__(self, *, namespace: str, workflow: str) -> Awaitable[bool]: ...


class NamespaceUids:
    """The uid each namespace has now, recorded with the runs and definitions written there
    (migration 15: readers show a row only while its namespace has that uid), read from the
    apiserver and kept ``ttl`` seconds. A namespace re-created within that gets its first
    rows with the old uid: hidden from its readers, never shown to another namespace's. A
    refusal to read it (RBAC without ``get namespaces``) records no uid (the row is then
    shown as rows from before migration 15 are) and is logged once."""

    def __init__(self, read: Callable[[str], Awaitable[str | None]], *, ttl: float = 10.0) -> None:
        self._read = read
        self._known: TTLCache[str, str | None] = TTLCache(maxsize=10_000, ttl=ttl)
        self._refused = False

    async def uid(self, namespace: str) -> str | None:
        if namespace in self._known:
            return self._known[namespace]
        try:
            found = await self._read(namespace)
        except KubernetesRefusal as error:
            if not self._refused:
                logger.warning("namespace uids are not recorded: %s", error.message)
                self._refused = True
            return None
        self._known[namespace] = found
        return found


async def no_namespace_uid(namespace: str) -> str | None:
    """For a RunCache that records no namespace uid (its rows are shown as older ones)."""
    return None


def _same_namespace(definition: StoredDefinition, namespace_uid: str | None) -> None:
    """A run never runs a definition published in an earlier namespace of the same name (one
    deleted since, perhaps someone else's): it is refused (unknown uids match)."""
    recorded = definition.namespace_uid
    if recorded is not None and namespace_uid is not None and recorded != namespace_uid:
        spec = definition.spec
        raise RunRefusedError(
            f"{spec.workflow} v{spec.version} was published in an earlier namespace named "
            f"{definition.namespace}, deleted since; publish the workflow here under a new "
            "version"
        )


class RunCache:
    def __init__(
        self,
        pool: Pool,
        *,
        definition_tasks: int = DEFINITION_CACHE_TASKS,
        namespace_uid: Callable[[str], Awaitable[str | None]] = no_namespace_uid,
    ) -> None:
        self._pool = pool
        self._namespace_uid = namespace_uid
        # publishes a workflow's stored but unpublished definitions (set by the operator)
        self.publish_pending: PublishPending | None = None
        self._by_uid: dict[str, RunContext] = {}
        self._by_id: dict[int, RunContext] = {}
        self.definitions: LRUCache[str, RunDefinition] = LRUCache(
            maxsize=definition_tasks, getsizeof=lambda definition: definition.spec.task_count + 1
        )
        # uids of active runs this process dispatched / whose cancel it applied
        self.started: set[str] = set()
        self.cancelled: set[str] = set()
        self._final: LRUCache[str, tuple[int, RunPhase]] = LRUCache(
            maxsize=REMEMBERED_FINISHED_RUNS
        )

    def __len__(self) -> int:
        """How many contexts are cached (the active runs this process works on)."""
        return len(self._by_id)

    def __contains__(self, run_id: object) -> bool:
        """Whether the run's context is cached (it is active)."""
        return run_id in self._by_id

    def _remember(self, context: RunContext, phase: RunPhase) -> RunContext:
        if phase not in TERMINAL_RUN_PHASES:
            self._by_uid[context.uid] = context
            self._by_id[context.run_id] = context
        return context

    def forget(self, context: RunContext) -> None:
        """The run finished: nothing of it stays cached (its definition may, by content)."""
        self._by_uid.pop(context.uid, None)
        self._by_id.pop(context.run_id, None)
        self.started.discard(context.uid)
        self.cancelled.discard(context.uid)

    def finished(self, *, run_id: int, uid: str, phase: RunPhase) -> None:
        """Remember only the final phase of a finished run."""
        self._final[uid] = (run_id, phase)

    def final(self, uid: str) -> tuple[int, RunPhase] | None:
        """The run id and final phase of a run this process saw finish, if remembered."""
        return self._final.get(uid)

    def _compact(self, stored: StoredDefinition) -> RunDefinition:
        cached = self.definitions.get(stored.fingerprint)
        if cached is None:
            cached = RunDefinition.of(stored.spec, fingerprint=stored.fingerprint)
            self.definitions[stored.fingerprint] = cached
        return cached

    async def _definition(self, definition_id: int) -> RunDefinition:
        cached = self.definitions.get(await definition_fingerprint(self._pool, definition_id))
        if cached is not None:
            return cached
        return self._compact(await load_definition_by_id(self._pool, definition_id))

    async def ensure(self, body: Mapping[str, Any], *, fence: Fence) -> Sighting:
        """The run of this WorkflowRun object, created (run and task rows, one transaction)
        when it does not exist yet."""
        metadata = body["metadata"]
        uid = str(metadata["uid"])
        known = self._by_uid.get(uid)
        if known is not None:
            return Sighting(context=known, created=False, phase=None)
        namespace, name = str(metadata["namespace"]), str(metadata["name"])
        existing = await find_run_id_by_uid(self._pool, namespace=namespace, uid=uid)
        if existing is not None:
            context, phase = await self._load(existing)
            return Sighting(context=context, created=False, phase=phase)
        if refused_for_good(body):  # once refused, not started when the key frees
            message = str((body.get("status") or {}).get("message") or "")
            raise RunRefusedError(message, reason=CONCURRENCY_FORBIDDEN)
        spec = body.get("spec") or {}
        namespace_uid = await self._namespace_uid(namespace)
        try:
            definition = await self._load_definition(namespace, spec)
            _same_namespace(definition, namespace_uid)
            # the run's shape: what admission checked, decided again on what is stored
            parameters = dict(expand(definition.spec, spec.get("parameters") or {}).parameters)
        except (UserError, StoredDefinitionInvalidError) as error:
            raise RunRefusedError(str(error)) from error
        try:
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
                idempotency_key=spec.get("idempotencyKey"),
                namespace_uid=namespace_uid,
            )
        except ConcurrencyForbiddenError as error:
            raise RunRefusedError(str(error), reason=CONCURRENCY_FORBIDDEN) from error
        context = RunContext(
            run_id=created.run.id,
            namespace=namespace,
            name=name,
            uid=uid,
            parameters=parameters,
            definition=self._compact(definition),
        )
        phase = created.run.phase
        return Sighting(
            context=self._remember(context, phase), created=created.created, phase=phase
        )

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
        context, _ = await self._load(run_id)
        return context

    async def _load(self, run_id: int) -> tuple[RunContext, RunPhase]:
        record = await get_run(self._pool, run_id)
        context = RunContext(
            run_id=record.id,
            namespace=record.namespace,
            name=record.name,
            uid=record.uid,
            parameters=dict(record.parameters),
            definition=await self._definition(record.definition_id),
        )
        return self._remember(context, record.phase), record.phase

    async def by_uid(self, *, namespace: str, uid: str) -> RunContext | None:
        known = self._by_uid.get(uid)
        if known is not None:
            return known
        run_id = await find_run_id_by_uid(self._pool, namespace=namespace, uid=uid)
        return None if run_id is None else await self.by_id(run_id)

    async def claimed(self, uid: str) -> RunContext | None:
        """The run a Job claims by uid, in whatever namespace the Job is (a copy elsewhere
        is still reported on the run it claims)."""
        known = self._by_uid.get(uid)
        if known is not None:
            return known
        run_id = await find_run_id_by_uid_anywhere(self._pool, uid)
        return None if run_id is None else await self.by_id(run_id)
