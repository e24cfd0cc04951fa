"""``GET .../definitions`` and ``GET .../definitions/{name}``: a namespace's published
workflows, and one workflow's newest versions with their task types and graphs.

A version of a large workflow is costly to show (a 10,000-task definition takes about a
second to parse and its graph is 1.4 MB of JSON): its definition and graph come from the
server's caches (bounded in bytes, ``state.py``) or are made on the ``OffLoop`` threads,
and each version's JSON is written there too, graph spliced in as ``graphs.py`` renders
it, never as models validated again. At most ``state.DETAILS_AT_ONCE`` details are put
together at a time, so what they hold while being written stays bounded however many are asked.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Final

from fastapi import APIRouter, Response

from flowforge.server import access, models
from flowforge.server.errors import ApiError
from flowforge.server.graphs import GraphSkeleton
from flowforge.server.routes import ERRORS, Authenticated, Namespace, State, TaskKey
from flowforge.store import browse

# the newest versions a definition's detail shows
MAX_DETAIL_VERSIONS: Final = 20

router = APIRouter(prefix="/api/v1", responses=ERRORS)


@router.get("/namespaces/{namespace}/definitions", response_model=models.DefinitionList)
async def definitions(
    caller: Authenticated, state: State, namespace: Namespace
) -> models.DefinitionList:
    await state.authorizer.require(caller, namespace=namespace, permission=access.LIST_DEFINITIONS)
    async with state.reader([namespace]) as connection:
        rows = await browse.definition_versions(connection, namespace=namespace)
    grouped: dict[str, list[models.DefinitionVersionBrief]] = {}
    for row in rows:
        grouped.setdefault(row.workflow, []).append(
            models.DefinitionVersionBrief(
                version=row.version,
                fingerprint=row.fingerprint,
                published_at=row.published_at,
                tasks=row.tasks,
            )
        )
    return models.DefinitionList(
        items=[
            models.DefinitionSummary(namespace=namespace, name=workflow, versions=versions)
            for workflow, versions in grouped.items()
        ]
    )


def version_json(head: models.DefinitionVersionHead, skeleton: GraphSkeleton) -> bytes:
    """A ``models.DefinitionVersion`` as JSON: the head's, the graph's written in."""
    written = head.model_dump_json(by_alias=True).encode()
    return written[:-1] + b',"graph":' + skeleton.render(None, None) + b"}"


def detail_json(*, namespace: str, name: str, versions: list[bytes]) -> bytes:
    """A ``models.DefinitionDetail`` as JSON, of versions written by ``version_json``."""
    identity = json.dumps({"namespace": namespace, "name": name}, separators=(",", ":"))
    return b"".join([identity[:-1].encode(), b',"versions":[', b",".join(versions), b"]}"])


@router.get("/namespaces/{namespace}/definitions/{name}", response_model=models.DefinitionDetail)
async def definition(
    caller: Authenticated, state: State, namespace: Namespace, name: TaskKey
) -> Response:
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_DEFINITIONS)
    versions: list[bytes] = []
    async with state.definition_details, state.reader([namespace]) as connection:
        rows = await browse.definition_versions(connection, namespace=namespace, workflow=name)
        for row in rows[:MAX_DETAIL_VERSIONS]:
            view = await state.definition(connection, row.id)
            skeleton = await state.graph_skeleton(
                connection, definition_id=row.id, fingerprint=row.fingerprint
            )
            head = models.DefinitionVersionHead(
                version=row.version,
                fingerprint=row.fingerprint,
                published_at=row.published_at,
                task_types={
                    type_name: models.TaskTypeBrief(
                        image=template.image,
                        command=None if template.command is None else list(template.command),
                        args=None if template.args is None else list(template.args),
                    )
                    for type_name, template in view.spec.task_types.items()
                },
            )
            versions.append(await state.off_loop.run(partial(version_json, head, skeleton)))
        if not versions:
            raise ApiError(404, f'no workflow "{name}" in namespace "{namespace}"')
        body = await state.off_loop.run(
            partial(detail_json, namespace=namespace, name=name, versions=versions)
        )
    return Response(body, media_type="application/json")
