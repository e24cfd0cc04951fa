"""The operator publishes definitions, from persisted WorkflowDefinition objects only.

Admission never writes (it decides before anything is stored, and a later webhook or the
storage itself may still refuse the object). The operator publishes what the apiserver has
stored: on each watch event of a WorkflowDefinition, and on demand when a run names a version
whose object is stored but whose watch event has not been handled yet (a run applied in the
same `kubectl apply` as its definition).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flowforge.domain.api import NOT_PUBLISHED
from flowforge.domain.definition_status import definition_conditions
from flowforge.domain.errors import UserError
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.validation import parse_definition
from flowforge.kube.client import KubeClient
from flowforge.store.connection import Pool
from flowforge.store.definitions import publish_definition

logger = logging.getLogger("flowforge.operator")


@dataclass(frozen=True)
class PublishOutcome:
    definition: DefinitionSpec | None
    message: str

    def status(self, generation: Any, *, shown: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The WorkflowDefinition status that shows this outcome (``shown``: the object's
        status now, whose conditions keep their transition times while they hold)."""
        status: dict[str, Any] = {
            "observedGeneration": generation,
            "message": self.message,
            "conditions": definition_conditions(
                published=self.definition is not None,
                message=self.message,
                generation=generation if isinstance(generation, int) else None,
                now=datetime.now(UTC).replace(microsecond=0),
                shown=(shown or {}).get("conditions") or (),
            ),
        }
        if self.definition is not None:
            status.update(
                taskCount=len(self.definition.tasks), fingerprint=self.definition.fingerprint
            )
        return status


async def publish_object(
    pool: Pool, body: Mapping[str, Any], *, namespace_uid: str | None
) -> PublishOutcome:
    """Publish a stored WorkflowDefinition object (idempotent by content) with the uid its
    namespace has now."""
    metadata = body["metadata"]
    try:
        definition = parse_definition(body.get("spec") or {})
        await publish_definition(
            pool,
            namespace=metadata["namespace"],
            definition=definition,
            namespace_uid=namespace_uid,
        )
    except UserError as error:  # the database not answering is not a refusal: it propagates
        logger.warning("WorkflowDefinition %s not published: %s", metadata.get("name"), error)
        return PublishOutcome(definition=None, message=f"{NOT_PUBLISHED}: {error}"[:4000])
    return PublishOutcome(definition=definition, message="published")


def _version_of(obj: Mapping[str, Any]) -> int:
    version = obj["spec"].get("version")
    return version if type(version) is int else 0


class PendingPublisher:
    """Publishes the stored, not yet published versions of one workflow on demand."""

    def __init__(
        self,
        *,
        pool: Pool,
        kube: KubeClient,
        namespace_uid: Callable[[str], Awaitable[str | None]],
    ) -> None:
        self._pool = pool
        self._kube = kube
        self._namespace_uid = namespace_uid

    async def __call__(self, *, namespace: str, workflow: str) -> bool:
        """True when at least one version of ``workflow`` got published now or before."""
        objects = [
            obj
            for obj in await self._kube.list_definitions(namespace=namespace)
            if (obj.get("spec") or {}).get("workflow") == workflow
            and not (obj.get("metadata") or {}).get("deletionTimestamp")
        ]
        objects.sort(key=_version_of)
        namespace_uid = await self._namespace_uid(namespace)
        outcomes = [
            await publish_object(self._pool, obj, namespace_uid=namespace_uid) for obj in objects
        ]
        return any(outcome.definition is not None for outcome in outcomes)
