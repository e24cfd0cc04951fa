"""Who asks and what the policy allows, at admission (`operator/admission_access.py`) and the
SubjectAccessReview cache (`kube/access_review.py`), with a fake apiserver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowforge.admission.access import (
    AccessChecks,
    decide_definition_access,
    decide_run_access,
)
from flowforge.admission.review import AdmissionRequest
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.policy import Holdings
from flowforge.domain.validation import parse_definition
from flowforge.kube.access_review import (
    CREATE_JOBS,
    AccessReviewUnavailable,
    CachedAccessReviewer,
    UserInfo,
)
from tests.unit.admission_fakes import (
    ALICE,
    JOBS,
    NAMESPACE,
    POLICY,
    FakeAuthorizer,
    NamespaceHoldings,
    checks,
    definition_spec,
    wrap,
)


def with_account(account: str) -> dict[str, Any]:
    spec = definition_spec()
    spec["taskTypes"]["py"]["serviceAccountName"] = account
    return spec


def create(kind: str, spec: Any) -> AdmissionRequest:
    return AdmissionRequest(
        operation="CREATE",
        namespace=NAMESPACE,
        new_object=wrap(kind, spec),
        old_object=None,
        dry_run=False,
    )


USE_BUILDER = ("alice", "use", "serviceaccounts", "builder")


async def test_the_publisher_must_create_jobs_and_use_each_account_named() -> None:
    authorizer = FakeAuthorizer()
    request = create("WorkflowDefinition", with_account("builder"))
    verdict = await decide_definition_access(
        request, user=ALICE, checks=checks(authorizer, policies=[POLICY])
    )
    assert not verdict.allowed and verdict.code == 403
    assert (
        "user alice may not use serviceaccount 'builder' in namespace team-a (verb use on "
        "serviceaccounts) (named by spec.taskTypes.py.serviceAccountName)"
    ) in verdict.message
    assert "user alice may not create jobs in namespace team-a (verb create on jobs.batch)" in (
        verdict.message
    )
    # the review is of the user who asked, with everything the apiserver told us of them
    spec = authorizer.bodies[0]["spec"]
    assert (spec["user"], spec["uid"], spec["groups"], spec["extra"]) == (
        "alice",
        "u-1",
        ["devs"],
        {"team": ["a"]},
    )
    granted = FakeAuthorizer(JOBS, USE_BUILDER)
    assert (
        await decide_definition_access(
            request, user=ALICE, checks=checks(granted, policies=[POLICY])
        )
    ).allowed


async def test_rbac_is_not_enough_when_the_policy_does_not_list_the_account() -> None:
    granted = FakeAuthorizer(JOBS, USE_BUILDER)
    verdict = await decide_definition_access(
        create("WorkflowDefinition", with_account("builder")), user=ALICE, checks=checks(granted)
    )
    assert not verdict.allowed
    assert "spec.taskTypes.py.serviceAccountName: serviceaccount 'builder' is not allowed by " in (
        verdict.message
    )


async def test_no_user_no_admission_and_an_unreadable_policy_fails_closed() -> None:
    request = create("WorkflowDefinition", definition_spec())
    authorizer = FakeAuthorizer(JOBS)
    nobody = await decide_definition_access(request, user=None, checks=checks(authorizer))
    assert not nobody.allowed and "names no user" in nobody.message
    assert UserInfo.from_review({"username": ""}) is None
    broken = {"metadata": {"name": "p"}, "spec": {"caps": {"maxTasks": 10**9}}}
    verdict = await decide_definition_access(
        request, user=ALICE, checks=checks(authorizer, policies=[broken])
    )
    assert not verdict.allowed
    assert "FlowForgePolicy team-a/p is invalid (spec.caps.maxTasks" in verdict.message


async def test_an_apiserver_that_cannot_answer_denies_and_is_not_cached() -> None:
    authorizer = FakeAuthorizer(JOBS)
    authorizer.fail = True
    access = checks(authorizer)
    request = create("WorkflowDefinition", definition_spec())
    verdict = await decide_definition_access(request, user=ALICE, checks=access)
    assert not verdict.allowed and verdict.code == 503
    assert "could not check verb create on jobs.batch for user alice" in verdict.message
    authorizer.fail = False
    assert (await decide_definition_access(request, user=ALICE, checks=access)).allowed


async def test_a_run_is_checked_against_its_definition_and_the_policy_as_it_is_now() -> None:
    stored = parse_definition(with_account("builder"))
    run = create("WorkflowRun", {"workflow": "etl", "version": 1, "parameters": {"p": "xyz"}})
    capped = {**POLICY, "spec": {**POLICY["spec"], "caps": {"maxParameterValueLength": 2}}}
    granted = FakeAuthorizer(JOBS, USE_BUILDER)
    verdict = await decide_run_access(
        run, user=ALICE, checks=checks(granted, policies=[capped], stored=stored)
    )
    assert not verdict.allowed
    assert "alice may not run workflow 'etl' version 1 in namespace team-a" in verdict.message
    assert "spec.parameters[p]: has 3 characters; policy team-a/p allows at most 2" in (
        verdict.message
    )
    bare = FakeAuthorizer(JOBS)
    refused = await decide_run_access(
        run, user=ALICE, checks=checks(bare, policies=[POLICY], stored=stored)
    )
    assert "use serviceaccount 'builder'" in refused.message
    missing = await decide_run_access(run, user=ALICE, checks=checks(granted, stored=None))
    assert not missing.allowed and "cannot be read" in missing.message


async def test_reviews_are_cached_per_user_and_shared_while_in_flight() -> None:
    now = [0.0]
    authorizer = FakeAuthorizer(JOBS)
    reviewer = CachedAccessReviewer(authorizer.review, clock=lambda: now[0], deny_ttl=1.0)
    answers = await asyncio.gather(
        *(reviewer.allowed(ALICE, namespace="team-a", permission=CREATE_JOBS) for _ in range(20))
    )
    assert answers == [True] * 20 and reviewer.reviews_sent == 1
    bob = UserInfo(username="bob")
    assert not await reviewer.allowed(bob, namespace="team-a", permission=CREATE_JOBS)
    # another namespace or another group set is another question
    await reviewer.allowed(ALICE, namespace="team-b", permission=CREATE_JOBS)
    other_groups = UserInfo(username="alice", uid="u-1", groups=("admins",))
    await reviewer.allowed(other_groups, namespace="team-a", permission=CREATE_JOBS)
    assert reviewer.reviews_sent == 4
    # a denial is forgotten sooner than an allow, so a grant takes effect quickly
    authorizer.grants.add(("bob", "create", "jobs", ""))
    now[0] = 1.5
    assert await reviewer.allowed(bob, namespace="team-a", permission=CREATE_JOBS)
    await reviewer.allowed(ALICE, namespace="team-a", permission=CREATE_JOBS)
    assert reviewer.reviews_sent == 5


async def test_a_failed_review_reaches_every_waiter() -> None:
    authorizer = FakeAuthorizer()
    authorizer.fail = True
    reviewer = CachedAccessReviewer(authorizer.review)
    results = await asyncio.gather(
        *(reviewer.allowed(ALICE, namespace="n", permission=CREATE_JOBS) for _ in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(result, AccessReviewUnavailable) for result in results)
    with pytest.raises(AccessReviewUnavailable):
        await reviewer.allowed(ALICE, namespace="n", permission=CREATE_JOBS)


async def test_policies_that_cannot_be_listed_deny_naming_why() -> None:
    async def list_policies(namespace: str) -> list[dict[str, Any]]:
        raise ConnectionError("apiserver down")

    async def load_definition(**_: Any) -> DefinitionSpec | None:
        return None

    access = AccessChecks(
        reviewer=CachedAccessReviewer(FakeAuthorizer(JOBS).review),
        list_policies=list_policies,
        load_definition=load_definition,
        holdings=NamespaceHoldings(),
    )
    verdict = await decide_definition_access(
        create("WorkflowDefinition", definition_spec()), user=ALICE, checks=access
    )
    assert not verdict.allowed and verdict.code == 503
    assert "the FlowForgePolicy objects of namespace team-a cannot be read" in verdict.message


async def test_only_creation_is_checked_and_a_malformed_object_is_left_to_admission() -> None:
    access = checks(FakeAuthorizer())
    update = AdmissionRequest(
        operation="UPDATE",
        namespace=NAMESPACE,
        new_object=wrap("WorkflowRun", {"workflow": "etl", "version": 1, "cancel": True}),
        old_object=wrap("WorkflowRun", {"workflow": "etl", "version": 1}),
        dry_run=False,
    )
    assert (await decide_run_access(update, user=ALICE, checks=access)).allowed
    for spec in (None, {"workflow": 3}, {"workflow": "etl", "version": "1"}):
        request = create("WorkflowRun", spec)
        assert (await decide_run_access(request, user=ALICE, checks=access)).allowed
    cyclic = definition_spec()
    cyclic["tasks"][0]["dependsOn"] = ["load"]
    request = create("WorkflowDefinition", cyclic)
    assert (await decide_definition_access(request, user=ALICE, checks=access)).allowed


async def test_a_sidecar_image_outside_the_registries_is_refused_at_admission() -> None:
    spec = definition_spec()
    spec["taskTypes"]["py"]["image"] = "ghcr.io/acme/app:1"
    spec["taskTypes"]["py"]["initContainers"] = [
        {"name": "proxy", "image": "evil.io/proxy:1", "restartPolicy": "Always"}
    ]
    policy = {"metadata": {"name": "p"}, "spec": {"registries": ["ghcr.io"]}}
    verdict = await decide_definition_access(
        create("WorkflowDefinition", spec),
        user=ALICE,
        checks=checks(FakeAuthorizer(JOBS), policies=[policy]),
    )
    assert not verdict.allowed and verdict.code == 403
    assert "spec.taskTypes.py.initContainers[0].image: registry evil.io is not allowed" in (
        verdict.message
    )
    assert "spec.taskTypes.py.image" not in verdict.message


@pytest.mark.parametrize(
    ("priority", "allowed"),
    [(None, True), (5, True), (6, False), (10**40, False), ("6", False), (True, False)],
)
async def test_a_runs_priority_is_held_to_the_policys_max_priority(
    priority: object, allowed: bool
) -> None:
    """A priority above maxPriority is refused naming spec.priority; one of another type
    (which the schema refuses anyway) is judged as the highest there is."""
    spec: dict[str, Any] = {"workflow": "etl", "version": 1}
    if priority is not None:
        spec["priority"] = priority
    policy = {"metadata": {"name": "p"}, "spec": {"maxPriority": 5}}
    verdict = await decide_run_access(
        create("WorkflowRun", spec),
        user=ALICE,
        checks=checks(
            FakeAuthorizer(JOBS), policies=[policy], stored=parse_definition(definition_spec())
        ),
    )
    assert verdict.allowed is allowed
    if not allowed:
        assert "spec.priority: priority " in verdict.message
        assert "is higher than policy team-a/p allows (maxPriority 5)" in verdict.message


@pytest.mark.parametrize(
    ("held", "refusal"),
    [
        (Holdings(queued_runs=2, task_rows=0), None),
        (
            Holdings(queued_runs=3, task_rows=0),
            "spec: 3 runs of the namespace are queued; policy team-a/p allows at most 3 "
            "(maxQueuedRuns): try again when runs have left the queue",
        ),
        (Holdings(queued_runs=0, task_rows=98), None),  # the run's 2 rows fit exactly
        (
            Holdings(queued_runs=0, task_rows=99),
            "spec: the run has 2 task rows and the namespace's unfinished runs hold 99; "
            "policy team-a/p allows at most 100 (maxTaskRows)",
        ),
    ],
)
async def test_a_run_over_the_policys_queue_or_task_row_cap_is_refused(
    held: Holdings, refusal: str | None
) -> None:
    """What the namespace holds is read once from the store (one query), and judged with
    the run's own rows against maxQueuedRuns and maxTaskRows."""
    holdings = NamespaceHoldings(held=held)
    policy = {"metadata": {"name": "p"}, "spec": {"maxQueuedRuns": 3, "maxTaskRows": 100}}
    verdict = await decide_run_access(
        create("WorkflowRun", {"workflow": "etl", "version": 1}),
        user=ALICE,
        checks=checks(
            FakeAuthorizer(JOBS),
            policies=[policy],
            stored=parse_definition(definition_spec()),
            holdings=holdings,
        ),
    )
    assert holdings.asked == [NAMESPACE]
    assert verdict.allowed is (refusal is None)
    if refusal is not None:
        assert verdict.code == 403 and refusal in verdict.message


async def test_holdings_are_read_only_when_a_policy_caps_them_and_unread_they_refuse() -> None:
    run = create("WorkflowRun", {"workflow": "etl", "version": 1})
    stored = parse_definition(definition_spec())
    uncapped = NamespaceHoldings()
    verdict = await decide_run_access(
        run, user=ALICE, checks=checks(FakeAuthorizer(JOBS), stored=stored, holdings=uncapped)
    )
    assert verdict.allowed and uncapped.asked == []  # no cap: no store read
    down = NamespaceHoldings(error=ConnectionError("store down"))
    policy = {"metadata": {"name": "p"}, "spec": {"maxQueuedRuns": 3}}
    verdict = await decide_run_access(
        run,
        user=ALICE,
        checks=checks(FakeAuthorizer(JOBS), policies=[policy], stored=stored, holdings=down),
    )
    assert not verdict.allowed and verdict.code == 503
    assert "what namespace team-a holds cannot be read (ConnectionError); try again" in (
        verdict.message
    )


async def test_a_run_of_a_definition_whose_queue_the_policy_no_longer_allows_is_refused() -> None:
    queued = definition_spec()
    queued["taskTypes"]["py"]["queueName"] = "team-b-gpu"
    stored = parse_definition(queued)
    policy = {"metadata": {"name": "p"}, "spec": {"queues": ["team-a-*"]}}
    verdict = await decide_run_access(
        create("WorkflowRun", {"workflow": "etl", "version": 1}),
        user=ALICE,
        checks=checks(FakeAuthorizer(JOBS), policies=[policy], stored=stored),
    )
    assert not verdict.allowed and verdict.code == 403
    assert (
        "spec.taskTypes.py.queueName: LocalQueue 'team-b-gpu' is not allowed by policy team-a/p"
    ) in verdict.message


@pytest.mark.parametrize(
    ("regions", "allowed"), [(["eu", "us"], True), (["eu", "us", "ap"], False)]
)
async def test_a_policy_lowers_the_items_a_for_each_may_have(
    regions: list[str], allowed: bool
) -> None:
    document = definition_spec()
    document["parameters"] = [{"name": "regions", "type": "array", "items": {"type": "string"}}]
    document["tasks"][0]["forEach"] = {"items": "params.regions"}
    policy = {"metadata": {"name": "p"}, "spec": {"caps": {"maxItemsPerTask": 2}}}
    verdict = await decide_run_access(
        create(
            "WorkflowRun", {"workflow": "etl", "version": 1, "parameters": {"regions": regions}}
        ),
        user=ALICE,
        checks=checks(FakeAuthorizer(JOBS), policies=[policy], stored=parse_definition(document)),
    )
    assert verdict.allowed is allowed, verdict.message
    if not allowed:
        assert "spec.tasks[0].forEach.items" in verdict.message
        assert "3 items" in verdict.message and "team-a/p" in verdict.message
