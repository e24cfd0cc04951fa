"""Who the read API lets in: bearer tokens by TokenReview, cached by hash for a short time,
concurrent checks of one token sharing one review; the rollback's order in its view."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from flowforge.kube.access_review import UserInfo
from flowforge.server.access import TOKEN_TTL_SECONDS, Authenticator
from flowforge.server.errors import ApiError
from flowforge.server.views import compensation
from flowforge.store.browse import TaskRow


class Reviews:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def review_token(self, token: str) -> UserInfo | None:
        self.asked.append(token)
        await asyncio.sleep(0.01)
        return UserInfo(username="alice", groups=("team",)) if token == "good" else None


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "header",
    [None, "", "Basic abc", "Bearer", "Bearer  ", "Bearer " + "x" * 20000, "Bearer a\x00b"],
)
async def test_missing_or_malformed_credentials_are_401_without_a_review(
    header: str | None,
) -> None:
    reviews = Reviews()
    with pytest.raises(ApiError) as refused:
        await Authenticator(reviews).caller(header)
    assert refused.value.status == 401
    assert reviews.asked == []


async def test_answers_are_cached_briefly_and_shared_while_in_flight() -> None:
    reviews, clock = Reviews(), Clock()
    authenticator = Authenticator(reviews, clock=clock)
    callers = await asyncio.gather(*(authenticator.caller("Bearer good") for _ in range(5)))
    assert {caller.user.username for caller in callers} == {"alice"}
    assert reviews.asked == ["good"]
    with pytest.raises(ApiError) as refused:
        await authenticator.caller("Bearer bad")
    assert refused.value.status == 401
    clock.now = TOKEN_TTL_SECONDS + 1
    await authenticator.caller("bearer good")
    assert reviews.asked == ["good", "bad", "good"]


def _row(key: str, state: str, *, undoes: str | None = None, at: int = 0) -> TaskRow:
    moment = datetime(2026, 1, 1, 0, 0, at, tzinfo=UTC) if at else None
    return TaskRow(key, undoes, state, 1, 1, moment, moment, None)


def test_the_rollback_lists_steps_as_they_ran_then_those_to_run() -> None:
    # compensators in topological order of their tasks: a before b before c
    compensators = [
        _row("undo-a", "pending", undoes="a"),
        _row("undo-b", "succeeded", undoes="b", at=2),
        _row("undo-c", "failed", undoes="c", at=1),
        _row("undo-x", "not_triggered", undoes="x"),
    ]
    shown = compensation(
        compensators,
        succeeded={"a", "b", "c"},
        starts={"undo-c": 10, "undo-b": 20},
        triggered_by="d",
    )
    assert [step.compensator for step in shown.steps] == ["undo-c", "undo-b", "undo-a"]
    assert [step.order for step in shown.steps] == [1, 2, 3]
    assert shown.state == "Halted" and shown.halted_by == "undo-c"
    assert shown.triggered_by == "d"
    untouched = compensation(compensators[3:], succeeded={"x"}, starts={}, triggered_by=None)
    assert untouched.state == "NotTriggered" and untouched.steps == []


class HeldReviews:
    """A TokenReview that answers only when released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.asked = 0

    async def review_token(self, token: str) -> UserInfo | None:
        self.asked += 1
        await self.release.wait()
        return UserInfo(username="alice")


async def test_a_cancelled_request_does_not_strand_the_others_waiting_on_its_review() -> None:
    reviews = HeldReviews()
    authenticator = Authenticator(reviews)
    first = asyncio.ensure_future(authenticator.caller("Bearer good"))
    await asyncio.sleep(0)  # the first request's review is in flight
    second = asyncio.ensure_future(authenticator.caller("Bearer good"))
    await asyncio.sleep(0)
    first.cancel()  # its client went away
    with pytest.raises(asyncio.CancelledError):
        await first
    reviews.release.set()
    caller = await asyncio.wait_for(second, timeout=5)
    assert caller.user.username == "alice"
    assert reviews.asked == 1
    # and the answer was kept for the next request
    assert (await authenticator.caller("Bearer good")).user.username == "alice"
    assert reviews.asked == 1
