"""The ``/api/v1`` endpoints (``docs/api.md``). Each one authenticates the caller, checks the
namespace it reads with a SubjectAccessReview, then reads the store in a transaction scoped
to that namespace; cancel, retry and a run's actions are the caller's own calls to the
Kubernetes API."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from flowforge.domain.api import API_VERSION, RUN_KIND
from flowforge.domain.execution import job_name
from flowforge.domain.run_actions import KIND as ACTION_KIND
from flowforge.domain.run_actions import parse_action
from flowforge.domain.states import TaskRole
from flowforge.kube.jobs import CONTAINER_NAME
from flowforge.server import access, listing, models, reads, views
from flowforge.server.access import Caller
from flowforge.server.errors import ApiError
from flowforge.server.state import ServerState
from flowforge.store import browse
from flowforge.store.queries import recorded_job_uid_on

DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_NAME: Final = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
PHASE: Final = r"^[A-Z][A-Za-z]{0,31}$"
MAX_LIMIT: Final = 500
MAX_LOG_BYTES: Final = 2 * 1024 * 1024

ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    code: {"model": models.ErrorResponse, "description": reason}
    for code, reason in (
        (400, "BadRequest"),
        (401, "Unauthorized"),
        (403, "Forbidden"),
        (404, "NotFound"),
        (503, "Unavailable"),
    )
}

bearer = HTTPBearer(auto_error=False, description="A Kubernetes bearer token")
router = APIRouter(prefix="/api/v1", responses=ERRORS)

Namespace = Annotated[str, Path(pattern=DNS_LABEL, max_length=63, description="a namespace")]
RunName = Annotated[str, Path(pattern=DNS_NAME, max_length=253, description="a WorkflowRun")]
# a task's key, or a forEach item's (``deploy[eu-west-1]``, docs/foreach.md)
TASK_ROW_KEY: Final = (
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\[[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?\])?$"
)
TaskKey = Annotated[
    str,
    Path(pattern=TASK_ROW_KEY, max_length=97, description="a task's key, or an item's: task[item]"),
]


def json_of(model: BaseModel) -> Response:
    """A response model serialised once (FastAPI would validate a returned model again)."""
    return Response(model.model_dump_json(by_alias=True), media_type="application/json")


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.flowforge
    return state


State = Annotated[ServerState, Depends(server_state)]


async def authenticated(
    request: Request,
    state: State,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    return await state.authenticator.caller(request.headers.get("authorization"))


Authenticated = Annotated[Caller, Depends(authenticated)]


@router.get("/whoami", response_model=models.WhoAmI)
async def whoami(caller: Authenticated) -> models.WhoAmI:
    return models.WhoAmI(username=caller.user.username, groups=list(caller.user.groups))


@router.get("/namespaces", response_model=models.NamespaceList)
async def namespaces(
    caller: Authenticated,
    state: State,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = MAX_LIMIT,
    continue_: Annotated[str | None, Query(alias="continue", max_length=256)] = None,
) -> models.NamespaceList:
    """Namespaces known to the store in which the caller may list WorkflowRuns, by name.
    A page may hold fewer than ``limit`` (even none) and still have a ``continue``."""
    after = cursor_after(continue_)
    names, last = await listing.namespaces(
        state, caller, after=after, limit=limit, permission=access.LIST_RUNS
    )
    return models.NamespaceList(
        items=[models.NamespaceItem(name=name) for name in names],
        continue_=None if last is None else cursor("after", last),
    )


def _cursor_field(text: str, field: str) -> object:
    try:
        padded = text + "=" * (-len(text) % 4)
        return json.loads(base64.urlsafe_b64decode(padded.encode()))[field]
    except (ValueError, KeyError, TypeError, binascii.Error) as error:
        raise ApiError(400, "invalid parameter continue: not a cursor this server gave") from error


def cursor_before(text: str | None) -> int | None:
    """The id a ``continue`` cursor this server gave continues before."""
    if text is None:
        return None
    before = _cursor_field(text, "before")
    if not isinstance(before, int) or isinstance(before, bool) or before < 1:
        raise ApiError(400, "invalid parameter continue: not a cursor this server gave")
    return before


def cursor_after(text: str | None) -> str | None:
    """The name a ``continue`` cursor this server gave continues after."""
    if text is None:
        return None
    after = _cursor_field(text, "after")
    if not isinstance(after, str) or not after:
        raise ApiError(400, "invalid parameter continue: not a cursor this server gave")
    return after


def cursor(field: str, value: int | str) -> str:
    return base64.urlsafe_b64encode(json.dumps({field: value}).encode()).decode().rstrip("=")


def next_cursor(last_id: int) -> str:
    return cursor("before", last_id)


@router.get("/runs", response_model=models.RunList, response_model_by_alias=True)
async def list_runs(
    caller: Authenticated,
    state: State,
    namespace: Annotated[str | None, Query(pattern=DNS_LABEL, max_length=63)] = None,
    workflow: Annotated[str | None, Query(pattern=DNS_LABEL, max_length=63)] = None,
    phase: Annotated[str | None, Query(pattern=PHASE, max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    continue_: Annotated[str | None, Query(alias="continue", max_length=256)] = None,
) -> models.RunList:
    """Runs, newest first; without ``namespace``, of every namespace the caller may list
    (then a page may hold fewer than ``limit``, even none, and still have a ``continue``)."""
    listed = browse.RunFilter(
        [] if namespace is None else [namespace],
        workflow=workflow,
        phase=phase,
        before=cursor_before(continue_),
        limit=limit,
    )
    if namespace is None:
        rows, after = await listing.runs(state, caller, listed=listed, permission=access.LIST_RUNS)
    else:
        await state.authorizer.require(caller, namespace=namespace, permission=access.LIST_RUNS)
        async with state.reader([namespace]) as connection:
            rows = await browse.list_runs(
                connection,
                namespaces=[namespace],
                workflow=workflow,
                phase=phase,
                before=listed.before,
                limit=limit + 1,
            )
        after = rows[limit - 1].id if len(rows) > limit else None
        rows = rows[:limit]
    return models.RunList(
        items=[views.summary(row) for row in rows],
        continue_=None if after is None else next_cursor(after),
    )


@router.get("/namespaces/{namespace}/runs/{name}", response_model=models.RunDetail)
async def run_detail(
    caller: Authenticated, state: State, namespace: Namespace, name: RunName
) -> Response:
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_RUNS)
    async with state.reader([namespace]) as connection:
        return json_of(await reads.detail(state, connection, namespace=namespace, name=name))


@router.get("/namespaces/{namespace}/runs/{name}/graph", response_model=models.Graph)
async def run_graph(
    caller: Authenticated, state: State, namespace: Namespace, name: RunName
) -> Response:
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_RUNS)
    async with state.reader([namespace]) as connection:
        drawn = await reads.graph(state, connection, namespace=namespace, name=name)
    return Response(drawn, media_type="application/json")


@router.get("/namespaces/{namespace}/runs/{name}/tasks/{task}", response_model=models.TaskDetail)
async def task_detail(
    caller: Authenticated, state: State, namespace: Namespace, name: RunName, task: TaskKey
) -> models.TaskDetail:
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_RUNS)
    async with state.reader([namespace]) as connection:
        return await reads.task(state, connection, namespace=namespace, name=name, task=task)


@router.get(
    "/namespaces/{namespace}/runs/{name}/tasks/{task}/attempts/{number}/log",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}, "description": "the attempt's log"}},
)
async def attempt_log(
    caller: Authenticated,
    state: State,
    namespace: Namespace,
    name: RunName,
    task: TaskKey,
    number: Annotated[int, Path(ge=1, le=1000)],
    compensator: bool = False,
) -> PlainTextResponse:
    """The log of one attempt's Pod (of the task, of its compensator with ``compensator``,
    or of a ``finally`` task), read with the caller's own token (``get pods/log``)."""
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_RUNS)
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_LOGS)
    async with state.reader([namespace]) as connection:
        run = await reads.find(connection, namespace=namespace, name=name)
        definition = await state.definition(connection, run.definition_id)
        key: str | None = task
        role = TaskRole.FINALLY
        if task not in definition.final_keys or compensator:
            # 404 for a task (or item) the DAG has not
            compensating = reads.compensator_row_key(definition, task, name=name)
            key, role = (
                (compensating, TaskRole.COMPENSATION) if compensator else (task, TaskRole.FORWARD)
            )
        if key is None:
            raise ApiError(404, f'run "{name}" has no task "{task}" with a compensator')
        # the Job FlowForge created and recorded, never one found by its name or label
        job_uid = await recorded_job_uid_on(connection, run_id=run.id, task_key=key, attempt=number)
    job = job_name(run_name=run.name, run_uid=run.uid, task_key=key, attempt=number, role=role)
    if job_uid is None:
        raise ApiError(404, f"no Job of attempt {number} was recorded (Job {job})")
    found = await state.user_api.job_log(
        token=caller.token,
        namespace=namespace,
        job_uid=job_uid,
        container=CONTAINER_NAME,
        max_bytes=MAX_LOG_BYTES,
    )
    if found is None:
        raise ApiError(404, f"no Pod of Job {job} (attempt {number}): it went with its Job")
    text, cut = found
    headers = {"X-Log-Truncated": "true"} if cut or len(text) >= MAX_LOG_BYTES else {}
    return PlainTextResponse(text, headers=headers)


@router.post(
    "/namespaces/{namespace}/runs/{name}/cancel",
    status_code=202,
    response_model=models.RunReference,
    responses={409: {"model": models.ErrorResponse}},
)
async def cancel(
    caller: Authenticated, namespace: Namespace, name: RunName, state: State
) -> models.RunReference:
    """Patch ``spec.cancel: true`` as the caller (RBAC and admission apply)."""
    patched = await state.user_api.cancel_run(token=caller.token, namespace=namespace, name=name)
    return models.RunReference(namespace=namespace, name=str(patched["metadata"]["name"]))


@router.post(
    "/namespaces/{namespace}/runs/{name}/retry",
    status_code=201,
    response_model=models.RunReference,
    responses={409: {"model": models.ErrorResponse}},
)
async def retry(
    caller: Authenticated, namespace: Namespace, name: RunName, state: State, response: Response
) -> models.RunReference:
    """Create a WorkflowRun ``<name>-retry-…`` with ``spec.retryOf: name`` as the caller."""
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_RUNS)
    async with state.reader([namespace]) as connection:
        run = await reads.find(connection, namespace=namespace, name=name)
    body = {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {"generateName": f"{name[:200]}-retry-"},
        "spec": {
            "workflow": run.workflow,
            "version": run.version,
            "parameters": dict(run.parameters),
            "retryOf": name,
        },
    }
    created = await state.user_api.create_run(token=caller.token, namespace=namespace, body=body)
    created_name = str(created["metadata"]["name"])
    response.headers["Location"] = f"/api/v1/namespaces/{namespace}/runs/{created_name}"
    return models.RunReference(namespace=namespace, name=created_name)


@router.get("/namespaces/{namespace}/runs/{name}/actions", response_model=models.RunActionList)
async def run_actions(
    caller: Authenticated, state: State, namespace: Namespace, name: RunName
) -> Response:
    """The run's WorkflowRunActions the operator processed, oldest first (its history)."""
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_RUNS)
    async with state.reader([namespace]) as connection:
        return json_of(await reads.actions(connection, namespace=namespace, name=name))


@router.post(
    "/namespaces/{namespace}/runs/{name}/actions",
    status_code=201,
    response_model=models.ActionReference,
    responses={409: {"model": models.ErrorResponse}},
)
async def create_action(
    caller: Authenticated,
    state: State,
    namespace: Namespace,
    name: RunName,
    request: models.ActionRequest,
) -> models.ActionReference:
    """Create a WorkflowRunAction about the run as the caller: RBAC (``create
    workflowrunactions``) and admission (the action's verb on the run) judge the caller,
    whom the webhook records as its actor."""
    spec = {"run": name, **request.model_dump(mode="json", exclude_none=True)}
    action, errors = parse_action(spec)
    if action is None:
        field, problem = errors[0]
        raise ApiError(400, f"invalid parameter {field.removeprefix('spec.')}: {problem}")
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_RUNS)
    async with state.reader([namespace]) as connection:
        await reads.find(connection, namespace=namespace, name=name)
    body = {
        "apiVersion": API_VERSION,
        "kind": ACTION_KIND,
        "metadata": {"generateName": f"{name[:200]}-{action.action.value.lower()}-"},
        "spec": spec,
    }
    created = await state.user_api.create_action(token=caller.token, namespace=namespace, body=body)
    return models.ActionReference(
        namespace=namespace, name=str(created["metadata"]["name"]), run=name
    )
