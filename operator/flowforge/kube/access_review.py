"""SubjectAccessReviews of the user who asked, batched and cached.

Shared by admission (``flowforge.operator``) and the read API (``flowforge.server``).
Admission asks the apiserver whether the requesting user (the review's ``userInfo``:
username, uid, groups, extra) may do what the operator would do for them. Answers are
cached for a short TTL by user, namespace and permission (an allow longer than a denial, so
a grant takes effect quickly), at most ``MAX_CACHED`` of them (least recently used out
first), and identical questions in flight share one review.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from flowforge.kube.answer_cache import AnswerCache

ALLOW_TTL_SECONDS: Final = 10.0
DENY_TTL_SECONDS: Final = 2.0
MAX_CACHED: Final = 4096

ReviewAccess = Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any]]]


class AccessReviewUnavailable(Exception):
    """The apiserver did not answer a SubjectAccessReview (admission then denies)."""


@dataclass(frozen=True)
class UserInfo:
    """Who sent the request, as the apiserver authenticated them."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_review(cls, raw: Any) -> UserInfo | None:
        """The review's ``request.userInfo``; None when it names nobody."""
        if not isinstance(raw, Mapping):
            return None
        username = raw.get("username")
        if not isinstance(username, str) or not username:
            return None
        groups = raw.get("groups")
        extra = raw.get("extra")
        return cls(
            username=username,
            uid=str(raw.get("uid") or ""),
            groups=tuple(str(group) for group in groups) if isinstance(groups, list) else (),
            extra=tuple(
                sorted(
                    (str(key), tuple(str(v) for v in values))
                    for key, values in extra.items()
                    if isinstance(values, list)
                )
            )
            if isinstance(extra, Mapping)
            else (),
        )


@dataclass(frozen=True)
class Permission:
    """One thing the user must be allowed: a verb on a (named) resource of a namespace."""

    verb: str
    resource: str
    group: str = ""
    name: str = ""
    subresource: str = ""

    def describe(self) -> str:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        if self.subresource:
            resource += f"/{self.subresource}"
        return f"verb {self.verb} on {resource}"


CREATE_JOBS: Final = Permission(verb="create", resource="jobs", group="batch")


def use_service_account(name: str) -> Permission:
    return Permission(verb="use", resource="serviceaccounts", name=name)


def review_body(user: UserInfo, *, namespace: str, permission: Permission) -> dict[str, Any]:
    """The SubjectAccessReview asking whether ``user`` holds ``permission``."""
    attributes = {"namespace": namespace, "verb": permission.verb, "resource": permission.resource}
    if permission.group:
        attributes["group"] = permission.group
    if permission.name:
        attributes["name"] = permission.name
    if permission.subresource:
        attributes["subresource"] = permission.subresource
    spec: dict[str, Any] = {
        "user": user.username,
        "groups": list(user.groups),
        "resourceAttributes": attributes,
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {key: list(values) for key, values in user.extra}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


_Key = tuple[UserInfo, str, Permission]


class CachedAccessReviewer:
    """Answers "may this user ...?" with SubjectAccessReviews through ``review``; answers
    by (user, namespace, permission), at most ``max_entries``, least recently used out
    first (``answer_cache.AnswerCache``)."""

    def __init__(
        self,
        review: ReviewAccess,
        *,
        clock: Callable[[], float] = time.monotonic,
        allow_ttl: float = ALLOW_TTL_SECONDS,
        deny_ttl: float = DENY_TTL_SECONDS,
        max_entries: int = MAX_CACHED,
    ) -> None:
        self._review = review
        self._answers: AnswerCache[_Key, bool] = AnswerCache(
            budget=max_entries,
            ttl=lambda allowed: allow_ttl if allowed else deny_ttl,
            clock=clock,
        )
        self.reviews_sent = 0

    async def missing(
        self, user: UserInfo, *, namespace: str, permissions: Sequence[Permission]
    ) -> list[Permission]:
        """The permissions ``user`` lacks in ``namespace``, asked concurrently."""
        unique = list(dict.fromkeys(permissions))
        answers = await asyncio.gather(
            *(self.allowed(user, namespace=namespace, permission=p) for p in unique)
        )
        return [permission for permission, ok in zip(unique, answers, strict=True) if not ok]

    async def allowed(self, user: UserInfo, *, namespace: str, permission: Permission) -> bool:
        return await self._answers.get(
            (user, namespace, permission),
            lambda: self._ask(user, namespace=namespace, permission=permission),
        )

    async def _ask(self, user: UserInfo, *, namespace: str, permission: Permission) -> bool:
        self.reviews_sent += 1
        body = review_body(user, namespace=namespace, permission=permission)
        try:
            response = await self._review(body)
        except Exception as error:
            raise AccessReviewUnavailable(
                f"could not check {permission.describe()} for user {user.username}: {error}"
            ) from error
        status = response.get("status")
        return isinstance(status, Mapping) and status.get("allowed") is True
