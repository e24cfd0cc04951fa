"""Admission of a WorkflowRunAction (``flowforge.domain.run_actions``).

A validating webhook cannot write, and the status subresource cannot be set at creation, so
who asked is recorded by the mutating webhook into an annotation FlowForge owns
(``flowforge.io/actor``: the review's ``userInfo``, username and groups, as JSON; whatever the
object said is replaced). The validating webhook then refuses an actor annotation that is not
the requesting user's (a forged one, or one set after the mutating webhook ran), checks the
spec (refusals name the field), and asks a SubjectAccessReview of the user for the action's
custom verb on ``workflowruns`` with the run as ``resourceName`` (``recover`` for
RetryCompensator and SkipCompensator; ``approve``, ``pause``). An action never changes once
created: an UPDATE of its spec or its actor is refused (the operator writes only status).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flowforge.admission.access import AccessReviewer
from flowforge.admission.review import AdmissionRequest, JsonPatchOperation, Verdict
from flowforge.domain.api import GROUP, RUN_PLURAL
from flowforge.domain.run_actions import ACTOR_ANNOTATION, VERBS, Actor, parse_action
from flowforge.kube.access_review import AccessReviewUnavailable, Permission, UserInfo

_ACTOR_PATH = "/metadata/annotations/" + ACTOR_ANNOTATION.replace("/", "~1")
_ACTOR_FIELD = f"metadata.annotations[{ACTOR_ANNOTATION}]"


def actor_text(user: UserInfo) -> str:
    """The actor annotation's value for ``user``."""
    return json.dumps(Actor(user.username, user.groups).to_dict(), sort_keys=True)


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def decide_action_mutation(request: AdmissionRequest, user: UserInfo | None) -> Verdict:
    """On CREATE, record who asks (whatever the object said)."""
    if request.operation != "CREATE" or user is None:
        return Verdict.allow()
    operations = []
    if not _annotations(request.new_object):
        operations.append(JsonPatchOperation(op="add", path="/metadata/annotations", value={}))
    operations.append(JsonPatchOperation(op="add", path=_ACTOR_PATH, value=actor_text(user)))
    return Verdict.allow(*operations)


async def decide_action(
    request: AdmissionRequest, user: UserInfo | None, *, reviewer: AccessReviewer
) -> Verdict:
    """Refuse a malformed, forged or changed action, or one its creator may not take."""
    new, old = request.new_object or {}, request.old_object or {}
    if request.operation == "UPDATE":
        if new.get("spec") != old.get("spec"):
            return Verdict.deny("spec: an action never changes; create a new one", code=422)
        if _annotations(new).get(ACTOR_ANNOTATION) != _annotations(old).get(ACTOR_ANNOTATION):
            return Verdict.deny(f"{_ACTOR_FIELD}: records who asked and cannot change", code=422)
        return Verdict.allow()
    if request.operation != "CREATE":
        return Verdict.allow()
    if user is None:
        return Verdict.deny("the review names no user: nobody to record as the actor", code=403)
    claimed = _annotations(new).get(ACTOR_ANNOTATION)
    if claimed != actor_text(user):
        return Verdict.deny(
            f"{_ACTOR_FIELD}: is set by FlowForge to the requesting user ({user.username!r}) "
            "and cannot be set by anyone else",
            code=422,
        )
    spec = new.get("spec")
    action, errors = parse_action(spec if isinstance(spec, Mapping) else {})
    if action is None:
        return Verdict.deny("; ".join(f"{path}: {problem}" for path, problem in errors), code=422)
    permission = Permission(
        verb=VERBS[action.action], resource=RUN_PLURAL, group=GROUP, name=action.run
    )
    try:
        missing = await reviewer.missing(
            user, namespace=request.namespace, permissions=[permission]
        )
    except AccessReviewUnavailable as error:
        return Verdict.deny(f"cannot check access now: {error}", code=503)
    if missing:
        return Verdict.deny(
            f"{user.username} may not {action.action.value} on WorkflowRun {action.run}: "
            f"{permission.describe()} (resourceName {action.run}) is needed",
            code=403,
        )
    return Verdict.allow()
