"""The WorkflowRun finalizer: deleting a run waits until its rollback has settled.

``observe_run`` is what the leader does with a WorkflowRun it sees (a watch event or the
reconciler's list). A run whose rows exist and whose definition has compensators gets
FlowForge's finalizer (``FINALIZER``, a JSON patch of ``metadata.finalizers``), so deleting
it leaves the object, and the Jobs it owns (the garbage collector waits for the owner), in
place. A run without compensators has no rollback to wait for and gets none (one write
less per run): deleting it removes the object at once, its Jobs go by garbage collection,
and the DELETED event (or the reconciler, for a missed one) records it cancelled. Once the
object has a ``deletionTimestamp`` the run is cancelled with its rollback, and the finalizer
is removed only when the store has finished the run (every triggered compensator resolved):
each status patch of the run and every reconciler pass look again, so a deletion left stuck
by a restart finishes too. ``flowforge.io/force-delete: "true"`` (or a foreground deletion,
where Kubernetes deletes the Jobs first) skips the rollback and lets the object go at once.
A standby operator never gets here (only the leader's handlers and reconciler call it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flowforge.domain.api import FINALIZER
from flowforge.domain.run import run_gone
from flowforge.domain.states import TERMINAL_RUN_PHASES
from flowforge.kube.errors import KubernetesError
from flowforge.operator.engine import Engine
from flowforge.store.runs import get_run

logger = logging.getLogger(__name__)

DELETING_REASON = "the WorkflowRun is being deleted"
# a JSON patch whose `test` failed: our view of the object was stale; a newer event or the
# next reconciler pass tries again
UNPROCESSABLE = 422


async def observe_run(engine: Engine, body: Mapping[str, Any]) -> None:
    """Start (or keep going) a run seen in the apiserver, or take its deletion forward."""
    engine.fence()  # the leader only: raises NotLeaderError on a standby
    metadata = body["metadata"]
    if metadata.get("deletionTimestamp"):
        await _deleting(engine, body)
        return
    await engine.start_run(body)  # its rows exist once this returns
    if FINALIZER in (metadata.get("finalizers") or []):
        return
    context = await engine.runs.by_uid(namespace=metadata["namespace"], uid=metadata["uid"])
    if context is not None and context.definition.spec.has_compensators:
        await _patch(engine, metadata, add_finalizer(metadata))


def add_finalizer(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch: append FINALIZER, if the object is still as seen."""
    finalizers = metadata.get("finalizers")
    if finalizers:
        return [
            {"op": "test", "path": "/metadata/finalizers", "value": list(finalizers)},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ]
    version = metadata.get("resourceVersion")
    unchanged = (
        []
        if version is None
        else [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
    )
    return [*unchanged, {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]


def remove_finalizer(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch: remove FINALIZER where it is (tested, so a moved entry is never hit)."""
    index = list(metadata.get("finalizers") or []).index(FINALIZER)
    path = f"/metadata/finalizers/{index}"
    return [{"op": "test", "path": path, "value": FINALIZER}, {"op": "remove", "path": path}]


async def _deleting(engine: Engine, body: Mapping[str, Any]) -> None:
    metadata = body["metadata"]
    held = FINALIZER in (metadata.get("finalizers") or [])
    context = await engine.runs.by_uid(namespace=metadata["namespace"], uid=metadata["uid"])
    if context is not None and run_gone(body, uid=context.uid):
        await engine.run_gone(context)  # no rollback: the Jobs go with the object
    elif context is not None:
        await engine.cancel(context, reason=DELETING_REASON)
        phase = (await get_run(engine.pool, context.run_id)).phase
        if phase not in TERMINAL_RUN_PHASES:
            return  # the rollback goes on; its end re-projects the status: a new event
    if held:
        logger.info("WorkflowRun %s/%s may go", metadata["namespace"], metadata["name"])
        await _patch(engine, metadata, remove_finalizer(metadata))


async def _patch(
    engine: Engine, metadata: Mapping[str, Any], operations: list[dict[str, Any]]
) -> None:
    try:
        await engine.kube.json_patch_run(
            namespace=metadata["namespace"], name=metadata["name"], operations=operations
        )
    except KubernetesError as error:
        if error.status != UNPROCESSABLE:
            raise
