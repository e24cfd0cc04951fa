"""``GET .../runs/{name}/stream``: a run's changes as server-sent events.

First ``event: snapshot`` (every task's state), then ``event: change`` with only the tasks
that changed, at most every ``poll_seconds``, and ``: keepalive`` every 15 s; the stream
ends once the run is final and its last change was sent. Change detection is one probe of
the run's newest event id per poll (``browse.change_marker``), in a transaction scoped to
the namespace like every read; the caller's token and access are checked again on every
poll (both cached briefly), so a revoked user stops receiving changes. Each stream is
bounded in time, and the server in how many it serves at once and to one user
(``limits.StreamSlots``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Final

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from flowforge.server import access, models, reads, views
from flowforge.server.errors import ApiError
from flowforge.server.limits import StreamSlot
from flowforge.server.routes import Authenticated, Namespace, RunName, State
from flowforge.server.state import ServerState
from flowforge.store import browse

KEEPALIVE_SECONDS: Final = 15.0
MAX_STREAM_SECONDS: Final = 3600.0

router = APIRouter(prefix="/api/v1")


def _event(kind: str, change: models.RunChange) -> bytes:
    return f"event: {kind}\ndata: {change.model_dump_json(by_alias=True)}\n\n".encode()


class RunStream:
    def __init__(self, state: ServerState, *, request: Request, namespace: str, name: str) -> None:
        self._state = state
        self._request = request
        self._namespace = namespace
        self._name = name
        self._states: dict[str, str] = {}
        self._marker = 0
        self._run_id = 0
        # the namespace's uid when the stream began: the run shown is of that namespace
        self._namespace_uids: dict[str, str] = {}

    async def snapshot(self) -> tuple[bytes, bool]:
        self._namespace_uids = await self._state.namespace_uids([self._namespace])
        async with self._state.reader(
            [self._namespace], namespace_uids=self._namespace_uids
        ) as connection:
            loaded = await reads.load(connection, namespace=self._namespace, name=self._name)
        self._states = loaded.states
        self._marker = loaded.run.marker
        self._run_id = loaded.run.id
        change = models.RunChange(
            run=loaded.with_conditions(), states=dict(self._states), compensation=loaded.rollback
        )
        return _event("snapshot", change), loaded.run.finished_at is not None

    async def _still_allowed(self) -> bool:
        try:
            caller = await self._state.authenticator.caller(
                self._request.headers.get("authorization")
            )
            await self._state.authorizer.require(
                caller, namespace=self._namespace, permission=access.GET_RUNS
            )
        except ApiError:
            return False
        return True

    async def change(self) -> tuple[bytes | None, bool]:
        """The next change event (None: nothing changed) and whether the run is final."""
        async with self._state.reader(
            [self._namespace], namespace_uids=self._namespace_uids
        ) as connection:
            marker = await browse.change_marker(connection, self._run_id)
            if marker == self._marker:
                return None, False
            run = await reads.find(connection, namespace=self._namespace, name=self._name)
            if run.id != self._run_id:
                raise ApiError(404, f'run "{self._name}" was replaced by a new object')
            events = await browse.events_after(connection, run.id, after=self._marker)
            touched = sorted({event.task_key for event in events if event.task_key})
            rows = await browse.run_tasks(connection, run.id, keys=touched, compensators=True)
            changed = {
                row.key: row.state
                for row in rows
                if row.key in touched and self._states.get(row.key) != row.state
            }
            self._states.update(changed)
            rollback = await reads.rollback_of(
                connection,
                run,
                compensators=[row for row in rows if row.compensates is not None],
                succeeded={key for key, value in self._states.items() if value == "succeeded"},
            )
        self._marker = max(run.marker, marker)
        summary = models.RunWithConditions(
            **views.summary(run).model_dump(), conditions=views.conditions(run, rollback)
        )
        change = models.RunChange(run=summary, states=changed, compensation=rollback)
        return _event("change", change), run.finished_at is not None

    async def events(self, first: bytes, finished: bool, slot: StreamSlot) -> AsyncIterator[bytes]:
        state = self._state
        try:
            yield first
            started = last_sent = time.monotonic()
            while not finished and time.monotonic() - started < MAX_STREAM_SECONDS:
                await asyncio.sleep(state.poll_seconds)
                if await self._request.is_disconnected() or not await self._still_allowed():
                    return
                try:
                    event, finished = await self.change()
                except ApiError:
                    return
                if event is not None:
                    yield event
                    last_sent = time.monotonic()
                elif time.monotonic() - last_sent >= KEEPALIVE_SECONDS:
                    yield b": keepalive\n\n"
                    last_sent = time.monotonic()
        finally:
            slot.release()


@router.get(
    "/namespaces/{namespace}/runs/{name}/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "server-sent events: snapshot, then change (data: RunChange JSON)",
            "content": {
                "text/event-stream": {"schema": {"$ref": "#/components/schemas/RunChange"}}
            },
        }
    },
)
async def run_stream(
    request: Request, caller: Authenticated, state: State, namespace: Namespace, name: RunName
) -> StreamingResponse:
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_RUNS)
    # counted before the next await: concurrent requests cannot all pass the check first
    slot = state.streams.take(caller.user.username)
    try:
        stream = RunStream(state, request=request, namespace=namespace, name=name)
        first, finished = await stream.snapshot()
    except BaseException:
        slot.release()
        raise
    return StreamingResponse(
        stream.events(first, finished, slot),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        # also when the body never starts (the client went away first); release is once
        background=BackgroundTask(slot.release),
    )
