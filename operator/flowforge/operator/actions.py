"""Processing a WorkflowRunAction (``flowforge.domain.run_actions``): once, in the run's
store transaction (``flowforge.store.actions``), then its status says who asked, the result
and why.

An action whose status has a result was processed: its events change nothing (a re-applied
or replayed action is a no-op; the store also answers an action uid it has seen with its
earlier result, for a crash between the commit and the status patch). The actor is the
annotation the admission webhook owns (``ACTOR_ANNOTATION``: the review's userInfo; a user's
own value is refused at admission). Watch events of one kind arrive in the order the
apiserver stored the objects, so a run's actions are processed in creation order; the run's
row lock orders any that race.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from flowforge.domain.run_actions import (
    ACTOR_ANNOTATION,
    ActionResult,
    Actor,
    RunAction,
    parse_action,
)
from flowforge.operator.engine import Engine
from flowforge.store.actions import apply_action
from flowforge.store.queries import find_run_id_by_uid


def actor_of(metadata: Mapping[str, Any]) -> Actor | None:
    """Who created the action, as the webhook recorded it; None when it did not."""
    text = (metadata.get("annotations") or {}).get(ACTOR_ANNOTATION)
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("username"), str):
        return None
    groups = value.get("groups") or []
    return Actor(
        username=value["username"],
        groups=tuple(str(group) for group in groups if isinstance(group, str)),
    )


async def process_action(engine: Engine, body: Mapping[str, Any]) -> None:
    """Apply the action ``body`` to its run once and write its result to its status."""
    if (body.get("status") or {}).get("result"):
        return
    metadata = body["metadata"]
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    actor = actor_of(metadata)
    action, errors = parse_action(body.get("spec") or {})
    if actor is None:
        message = "no actor was recorded at admission: create the action again"
    elif action is None:
        message = "; ".join(f"{path}: {problem}" for path, problem in errors)
    else:
        result, message = await _apply(engine, body, action=action, actor=actor)
        await _report(engine, namespace, name, actor=actor, result=result, message=message)
        return
    refused = ActionResult.REFUSED
    await _report(engine, namespace, name, actor=actor, result=refused, message=message)


async def _apply(
    engine: Engine, body: Mapping[str, Any], *, action: RunAction, actor: Actor
) -> tuple[ActionResult, str]:
    metadata = body["metadata"]
    namespace = str(metadata["namespace"])
    run = await engine.kube.read_run(namespace=namespace, name=action.run)
    if run is None:
        return ActionResult.REFUSED, f'no WorkflowRun "{action.run}" in {namespace}'
    run_id = await find_run_id_by_uid(
        engine.pool, namespace=namespace, uid=str(run["metadata"]["uid"])
    )
    if run_id is None:
        return ActionResult.REFUSED, f'WorkflowRun "{action.run}" has not started yet'
    context = await engine.runs.by_id(run_id)
    outcome = await apply_action(
        engine.pool,
        fence=engine.fence(),
        run_id=run_id,
        uid=str(metadata["uid"]),
        name=str(metadata["name"]),
        action=action,
        actor=actor,
    )
    await engine.applier.apply(context, outcome.decision)
    return outcome.result, outcome.message


async def _report(
    engine: Engine,
    namespace: str,
    name: str,
    *,
    actor: Actor | None,
    result: ActionResult,
    message: str,
) -> None:
    status: dict[str, Any] = {
        "result": result.value,
        "message": message,
        "processedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if actor is not None:
        status["actor"] = actor.to_dict()
    await engine.kube.patch_action_status(namespace=namespace, name=name, status=status)
