"""The operator publishes definitions, from persisted WorkflowDefinition objects only.

Admission never writes (it decides before anything is stored, and a later webhook or the
storage itself may still refuse the object). The operator publishes what the apiserver has
stored: on each watch event of a WorkflowDefinition, and on demand when a run names a version
whose object is stored but whose watch event has not been handled yet (a run applied in the
same `kubectl apply` as its definition).
"""

from __future__ import annotations

import asyncio
import functools
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
from flowforge.kube.pages import pages
from flowforge.operator.kubeport import KubePort
from flowforge.store.connection import Pool
from flowforge.store.definitions import publish_definition, published_fingerprint

logger = logging.getLogger("flowforge.operator")
# definitions per LIST page (each page also bounded in bytes: ``kube/pages.py``)
PAGE_SIZE = 100


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
    namespace has now. The spec is parsed on a thread: a 10,000-task one takes about 0.4 s
    of CPU, which the event loop's other work must not wait for."""
    metadata = body["metadata"]
    try:
        definition = await asyncio.to_thread(parse_definition, body.get("spec") or {})
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


async def already_judged(pool: Pool, body: Mapping[str, Any]) -> bool | None:
    """What the object's status already shows of its current generation, without parsing
    it: True, published (and the store holds that fingerprint for its workflow and version);
    False, refused; None, nothing (another generation, no status, or a fingerprint the
    store does not hold: it is judged again).

    The status is the operator's own (tenants may edit a definition, not its status), and
    a generation's spec never changes: a label or annotation change, or a resync, leaves
    the generation as it was, so the object needs no parse and no write."""
    metadata, spec = body.get("metadata") or {}, body.get("spec") or {}
    status = body.get("status") or {}
    generation = metadata.get("generation")
    if generation is None or status.get("observedGeneration") != generation:
        return None
    if str(status.get("message") or "").startswith(NOT_PUBLISHED):
        return False
    workflow, version, fingerprint = spec.get("workflow"), spec.get("version"), None
    if isinstance(workflow, str) and type(version) is int and status.get("message") == "published":
        fingerprint = await published_fingerprint(
            pool, namespace=str(metadata.get("namespace")), workflow=workflow, version=version
        )
    if fingerprint is None or fingerprint != status.get("fingerprint"):
        return None
    return True


async def publish_event(
    body: Mapping[str, Any],
    *,
    pool: Pool,
    kube: KubePort,
    namespace_uid: Callable[[str], Awaitable[str | None]],
) -> None:
    """A watch event of a WorkflowDefinition: publish it (unless its status already shows
    this generation judged) and show its task count and fingerprint, or why it is unusable,
    in its status."""
    if await already_judged(pool, body) is not None:
        return
    metadata = body["metadata"]
    current = body.get("status") or {}
    outcome = await publish_object(
        pool, body, namespace_uid=await namespace_uid(metadata["namespace"])
    )
    status = outcome.status(metadata.get("generation"), shown=current)
    if any(current.get(field) != value for field, value in status.items()):
        await kube.patch_definition_status(
            namespace=metadata["namespace"], name=metadata["name"], status=status
        )


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
        """True when at least one version of ``workflow`` got published now or before.

        The namespace's objects are listed in pages (``kube/pages.py``) keeping only the names
        of the workflow's, which are then read and published one at a time, in version
        order: another workflow's objects, however large, are never held."""
        named: list[tuple[int, str]] = []
        async for page in pages(
            functools.partial(self._kube.list_definitions, namespace=namespace), limit=PAGE_SIZE
        ):
            named += [
                (_version_of(obj), str(obj["metadata"]["name"]))
                for obj in page
                if (obj.get("spec") or {}).get("workflow") == workflow
                and not obj["metadata"].get("deletionTimestamp")
            ]
        published = False
        for _, name in sorted(named):
            body = await self._kube.read_definition(namespace=namespace, name=name)
            if body is None or (body.get("spec") or {}).get("workflow") != workflow:
                continue  # deleted, or another workflow's since it was listed
            judged = await already_judged(self._pool, body)
            if judged is None:
                uid = await self._namespace_uid(namespace)
                outcome = await publish_object(self._pool, body, namespace_uid=uid)
                judged = outcome.definition is not None
            published = published or judged
        return published


def _version_of(obj: Mapping[str, Any]) -> int:
    version = (obj.get("spec") or {}).get("version")
    return version if type(version) is int else 0
