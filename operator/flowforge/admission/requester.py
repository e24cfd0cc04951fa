"""Who asks is judged before anything is read for them.

Every review that reads something stored (the store's definitions and runs; the apiserver's
objects, policies, SubjectAccessReviews and dry-runs) first asks the apiserver, in one
SubjectAccessReview per permission, whether the requester (the review's ``userInfo``) may do
what the review says: its operation on that resource in its namespace, and for a retry
(``spec.retryOf``) also ``get`` on the run named, whose stored phase, workflow and
parameters are then read. A requester who may not is refused, naming the permission
missing, and nothing is read for them.

The apiserver authorizes a request before it asks admission, so this refuses only forged
reviews and retries of runs their requester cannot read. The answers are those of the
reviewer admission shares (`kube/access_review.py`: cached by user, namespace and
permission, an allow for 10 s), so a requester costs one round trip every 10 s.

An UPDATE of a definition, run or action compares the old and new objects and reads
nothing: it is not judged (the operator's own updates of runs ask nothing). A schedule's
UPDATE is judged as its CREATE is (its new spec is checked as the run it would make).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from flowforge.admission.access import CODE_UNAVAILABLE, AccessReviewer, missing_line
from flowforge.admission.review import CODE_FORBIDDEN, AdmissionRequest, Verdict
from flowforge.domain.api import GROUP, RUN_PLURAL
from flowforge.domain.schedule import PLURAL as SCHEDULE_PLURAL
from flowforge.kube.access_review import AccessReviewUnavailable, Permission, UserInfo

# the kinds whose UPDATE reads something stored
UPDATES_READING: Final = frozenset({SCHEDULE_PLURAL})

_RETRY_WHY = " (named by spec.retryOf: a retry reads the run it retries)"


def _metadata_name(obj: Mapping[str, object] | None) -> str:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else ""


def _retry_of(request: AdmissionRequest) -> str:
    spec = (request.new_object or {}).get("spec")
    retry_of = spec.get("retryOf") if isinstance(spec, Mapping) else None
    return retry_of if isinstance(retry_of, str) else ""


def requester_permissions(request: AdmissionRequest, *, plural: str) -> dict[Permission, str]:
    """What the requester must hold before anything is read for the review, each with why;
    none when the review reads nothing."""
    if request.operation == "CREATE":
        # RBAC names no object on create, nor does this question
        asked = Permission(verb="create", resource=plural, group=GROUP)
    elif request.operation == "UPDATE" and plural in UPDATES_READING:
        name = _metadata_name(request.new_object) or _metadata_name(request.old_object)
        asked = Permission(verb="update", resource=plural, group=GROUP, name=name)
    else:
        return {}
    needed = {asked: ""}
    retry_of = _retry_of(request) if plural == RUN_PLURAL else ""
    if retry_of:
        needed[Permission(verb="get", resource=RUN_PLURAL, group=GROUP, name=retry_of)] = _RETRY_WHY
    return needed


async def judge_requester(
    request: AdmissionRequest,
    user: UserInfo | None,
    *,
    plural: str,
    reviewer: AccessReviewer,
) -> Verdict:
    """Allowed when the requester holds every permission the review needs (or it needs
    none); otherwise refused naming each one missing, before anything stored is read."""
    needed = requester_permissions(request, plural=plural)
    if not needed:
        return Verdict.allow()
    namespace = request.namespace
    if user is None:
        return Verdict.deny(
            "the review names no user (request.userInfo.username), so nothing is checked for it",
            code=CODE_FORBIDDEN,
        )
    try:
        missing = await reviewer.missing(user, namespace=namespace, permissions=list(needed))
    except AccessReviewUnavailable as error:
        return Verdict.deny(f"cannot check who asks now: {error}; try again", code=CODE_UNAVAILABLE)
    if not missing:
        return Verdict.allow()
    lines = [missing_line(user, p, namespace=namespace, why=needed[p]) for p in missing]
    return Verdict.deny(
        f"refused before anything is checked for {user.username}:\n" + "\n".join(lines),
        code=CODE_FORBIDDEN,
    )
