"""Who is asking and what they may read: every ``/api/v1`` request's bearer token is checked
with a TokenReview, and every namespace it reads with a SubjectAccessReview of that user
(``flowforge.kube.access_review``), both cached briefly and bounded in size."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from flowforge.domain.api import DEFINITION_PLURAL, GROUP, RUN_PLURAL
from flowforge.domain.schedule import PLURAL as SCHEDULE_PLURAL
from flowforge.kube.access_review import (
    AccessReviewUnavailable,
    CachedAccessReviewer,
    Permission,
    UserInfo,
)
from flowforge.kube.answer_cache import AnswerCache
from flowforge.server.errors import ApiError

TOKEN_TTL_SECONDS: Final = 10.0
REJECTED_TOKEN_TTL_SECONDS: Final = 2.0
MAX_CACHED_TOKENS: Final = 4096
MAX_TOKEN_LENGTH: Final = 16384

LIST_RUNS: Final = Permission(verb="list", resource=RUN_PLURAL, group=GROUP)
GET_RUNS: Final = Permission(verb="get", resource=RUN_PLURAL, group=GROUP)
LIST_DEFINITIONS: Final = Permission(verb="list", resource=DEFINITION_PLURAL, group=GROUP)
GET_DEFINITIONS: Final = Permission(verb="get", resource=DEFINITION_PLURAL, group=GROUP)
LIST_SCHEDULES: Final = Permission(verb="list", resource=SCHEDULE_PLURAL, group=GROUP)
GET_SCHEDULES: Final = Permission(verb="get", resource=SCHEDULE_PLURAL, group=GROUP)
GET_LOGS: Final = Permission(verb="get", resource="pods", subresource="log")


class TokenReviews(Protocol):
    async def review_token(self, token: str) -> UserInfo | None: ...


@dataclass(frozen=True)
class Caller:
    """An authenticated request: the user and the token to act as them."""

    user: UserInfo
    token: str


class Authenticator:
    """Bearer token -> user, by TokenReview; answers cached by the token's hash (at most
    ``MAX_CACHED_TOKENS``, least recently used out first)."""

    def __init__(
        self, reviews: TokenReviews, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._reviews = reviews
        self._answers: AnswerCache[str, UserInfo | None] = AnswerCache(
            budget=MAX_CACHED_TOKENS,
            ttl=lambda user: TOKEN_TTL_SECONDS if user is not None else REJECTED_TOKEN_TTL_SECONDS,
            clock=clock,
        )

    async def caller(self, authorization: str | None) -> Caller:
        token = _bearer(authorization)
        key = hashlib.sha256(token.encode()).hexdigest()
        user = await self._answers.get(key, lambda: self._review(token))
        if user is None:
            raise ApiError(401, "the bearer token is not valid (TokenReview: not authenticated)")
        return Caller(user=user, token=token)

    async def _review(self, token: str) -> UserInfo | None:
        try:
            return await self._reviews.review_token(token)
        except Exception as error:
            raise ApiError(503, f"cannot check the token (TokenReview): {error}") from error


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise ApiError(401, "no credentials: send Authorization: Bearer <kubernetes token>")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "the Authorization header must be 'Bearer <kubernetes token>'")
    if len(token) > MAX_TOKEN_LENGTH or not token.isascii() or not token.isprintable():
        raise ApiError(401, "the bearer token is not a token")
    return token


class Authorizer:
    """May the caller do ``permission`` in a namespace? (SubjectAccessReviews, cached)."""

    def __init__(self, reviewer: CachedAccessReviewer) -> None:
        self._reviewer = reviewer

    async def allowed(self, caller: Caller, *, namespace: str, permission: Permission) -> bool:
        try:
            return await self._reviewer.allowed(
                caller.user, namespace=namespace, permission=permission
            )
        except AccessReviewUnavailable as error:
            raise ApiError(503, str(error)) from error

    async def require(self, caller: Caller, *, namespace: str, permission: Permission) -> None:
        if not await self.allowed(caller, namespace=namespace, permission=permission):
            raise ApiError(
                403,
                f'user "{caller.user.username}" may not {permission.describe()} in namespace '
                f'"{namespace}"',
            )
