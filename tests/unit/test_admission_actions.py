"""Admission of WorkflowRunActions: the actor is recorded from the review's userInfo and
cannot be forged or changed; the custom verb is checked on the run by name; a bad spec is
refused naming the field."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from flowforge.admission.actions import (
    actor_text,
    decide_action,
    decide_action_mutation,
)
from flowforge.admission.review import AdmissionRequest
from flowforge.kube.access_review import AccessReviewUnavailable, Permission, UserInfo

ALICE = UserInfo(username="alice", uid="u-1", groups=("ops", "system:authenticated"))
SKIP = {"run": "pay-1", "action": "SkipCompensator", "compensator": "refund", "reason": "done"}


class Reviewer:
    def __init__(self, *, granted: set[str] | None = None, down: bool = False) -> None:
        self.granted = granted or set()
        self.down = down
        self.asked: list[Permission] = []

    async def missing(
        self, user: UserInfo, *, namespace: str, permissions: Sequence[Permission]
    ) -> list[Permission]:
        if self.down:
            raise AccessReviewUnavailable("the apiserver did not answer")
        self.asked.extend(permissions)
        return [p for p in permissions if f"{p.verb}/{p.name}" not in self.granted]


def _action(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"namespace": "team", "name": "act-1"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowRunAction",
        "metadata": metadata,
        "spec": spec,
    }


def _request(new: dict[str, Any], *, old: dict[str, Any] | None = None) -> AdmissionRequest:
    return AdmissionRequest(
        operation="UPDATE" if old is not None else "CREATE",
        namespace="team",
        new_object=new,
        old_object=old,
        dry_run=False,
        user="alice",
    )


def _signed(spec: dict[str, Any], user: UserInfo = ALICE) -> dict[str, Any]:
    return _action(spec, {"flowforge.io/actor": actor_text(user)})


def test_the_mutating_webhook_records_the_requesting_user_over_whatever_was_given() -> None:
    forged = _action(SKIP, {"flowforge.io/actor": '{"username": "root"}'})
    bare = _action(SKIP)

    for obj in (forged, bare):
        verdict = decide_action_mutation(_request(obj), ALICE)
        assert verdict.allowed
        written = {op.path: op.value for op in verdict.patch}
        assert json.loads(written["/metadata/annotations/flowforge.io~1actor"]) == {
            "username": "alice",
            "groups": ["ops", "system:authenticated"],
        }
    assert decide_action_mutation(_request(bare), ALICE).patch[0].path == "/metadata/annotations"


async def test_an_action_by_a_holder_of_the_verb_on_that_run_is_allowed() -> None:
    reviewer = Reviewer(granted={"recover/pay-1"})

    verdict = await decide_action(_request(_signed(SKIP)), ALICE, reviewer=reviewer)

    assert verdict.allowed
    assert [(p.verb, p.resource, p.group, p.name) for p in reviewer.asked] == [
        ("recover", "workflowruns", "flowforge.io", "pay-1")
    ]


async def test_a_user_without_the_verb_is_refused_naming_it() -> None:
    verdict = await decide_action(
        _request(_signed(SKIP)), ALICE, reviewer=Reviewer(granted={"recover/other"})
    )

    assert not verdict.allowed and verdict.code == 403
    assert "verb recover on workflowruns.flowforge.io (resourceName pay-1)" in verdict.message


async def test_an_actor_that_is_not_the_requesting_user_is_refused() -> None:
    bob = UserInfo(username="bob")
    verdict = await decide_action(
        _request(_signed(SKIP, bob)), ALICE, reviewer=Reviewer(granted={"recover/pay-1"})
    )

    assert not verdict.allowed and "metadata.annotations[flowforge.io/actor]" in verdict.message


async def test_a_bad_spec_is_refused_naming_the_field() -> None:
    spec = {key: value for key, value in SKIP.items() if key != "reason"}
    verdict = await decide_action(
        _request(_signed(spec)), ALICE, reviewer=Reviewer(granted={"recover/pay-1"})
    )

    assert not verdict.allowed and verdict.message == (
        "spec.reason: is required for SkipCompensator"
    )


async def test_an_action_never_changes() -> None:
    old = _signed(SKIP)
    reviewer = Reviewer()

    changed_spec = await decide_action(
        _request(_signed({**SKIP, "reason": "other"}), old=old), ALICE, reviewer=reviewer
    )
    changed_actor = await decide_action(
        _request(_signed(SKIP, UserInfo(username="bob")), old=old), ALICE, reviewer=reviewer
    )
    labelled = dict(old, metadata={**old["metadata"], "labels": {"team": "a"}})
    unchanged = await decide_action(_request(labelled, old=old), ALICE, reviewer=reviewer)

    assert not changed_spec.allowed and "never changes" in changed_spec.message
    assert not changed_actor.allowed and "cannot change" in changed_actor.message
    assert unchanged.allowed


async def test_access_that_cannot_be_checked_is_refused() -> None:
    verdict = await decide_action(_request(_signed(SKIP)), ALICE, reviewer=Reviewer(down=True))

    assert not verdict.allowed and verdict.code == 503
