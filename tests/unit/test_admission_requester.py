"""Who asks is judged before anything is read for them (`admission/requester.py`), through
the kopf handlers as the server registers them (`admission/handlers.py`).

Mallory forges reviews naming team-a's workflow, runs and schedules; the apiserver (a fake
authorizer) grants her nothing there. Each review is refused naming the permission she lacks,
after one SubjectAccessReview and before any read of the store or the apiserver: no
definition, version, run, policy, holding or dry-run is asked for her. Alice, who may, gets
what she got before; her answer is remembered for a second review and forgotten after its
TTL (a fake clock)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import kopf
import pytest

from flowforge.admission.access import AccessChecks
from flowforge.admission.handlers import register_admission_handlers
from flowforge.admission.review import PersistedDefinition, RetrySource
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.policy import Holdings
from flowforge.domain.validation import parse_definition
from flowforge.kube.access_review import ALLOW_TTL_SECONDS, CachedAccessReviewer
from flowforge.kube.dryrun import DryRunAnswer
from flowforge.kube.webhook_config import (
    MUTATE_ACTION_HANDLER_ID,
    MUTATE_RUN_HANDLER_ID,
    MUTATE_SCHEDULE_HANDLER_ID,
    VALIDATE_ACTION_HANDLER_ID,
    VALIDATE_DEFINITION_HANDLER_ID,
    VALIDATE_RUN_HANDLER_ID,
    VALIDATE_SCHEDULE_HANDLER_ID,
)
from tests.unit.admission_fakes import (
    NAMESPACE,
    FakeAuthorizer,
    InMemoryRegistry,
    definition_spec,
    wrap,
)

MALLORY = {"username": "mallory", "uid": "u-9", "groups": ["system:authenticated"]}
ALICE = {"username": "alice", "uid": "u-1", "groups": ["devs"]}
FAILED = RetrySource(phase="Failed", workflow="etl", parameters={})
ALICE_MAY = (
    ("alice", "create", "workflowdefinitions", ""),
    ("alice", "create", "workflowruns", ""),
    ("alice", "create", "jobs", ""),
)


class Team:
    """Team-a's store and apiserver as admission reads them, every read recorded in
    ``reads``; SubjectAccessReviews are answered by ``authorizer`` (``bodies``)."""

    def __init__(self, *grants: tuple[str, str, str, str]) -> None:
        self.reads: list[str] = []
        self.authorizer = FakeAuthorizer(*grants)
        self.now = 1000.0
        self.stored = InMemoryRegistry()
        self.stored.publish(definition_spec())
        self.definition = parse_definition(definition_spec())
        self.checks = AccessChecks(
            reviewer=CachedAccessReviewer(self.authorizer.review, clock=lambda: self.now),
            list_policies=self.list_policies,
            load_definition=self.load_definition,
            holdings=self.holdings,
        )

    # the store's and the apiserver's definitions (DefinitionRegistry)
    async def published_fingerprint(
        self, *, namespace: str, workflow: str, version: int
    ) -> str | None:
        self.reads.append("published fingerprint")
        return await self.stored.published_fingerprint(
            namespace=namespace, workflow=workflow, version=version
        )

    async def published_versions(self, *, namespace: str, workflow: str) -> Sequence[int]:
        self.reads.append("published versions")
        return await self.stored.published_versions(namespace=namespace, workflow=workflow)

    async def persisted(
        self, *, namespace: str, workflow: str, version: int | None = None
    ) -> Sequence[PersistedDefinition]:
        self.reads.append("WorkflowDefinition objects")
        return await self.stored.persisted(namespace=namespace, workflow=workflow, version=version)

    # the store's runs (RetrySources)
    async def run_named(self, *, namespace: str, name: str) -> RetrySource | None:
        self.reads.append(f"run {name}")
        return FAILED if name == "nightly-42" else None

    async def running_runs(self, *, namespace: str, key: str) -> int:
        self.reads.append("running runs")
        return 0

    # the access checks' reads and the dry-runs (DryRunCreator)
    async def list_policies(self, namespace: str) -> list[dict[str, Any]]:
        self.reads.append("policies")
        return []

    async def load_definition(self, **_: Any) -> DefinitionSpec | None:
        self.reads.append("definition")
        return self.definition

    async def holdings(self, namespace: str) -> Holdings:
        self.reads.append("holdings")
        return Holdings(0, 0)

    async def create(self, manifest: Mapping[str, Any]) -> DryRunAnswer:
        self.reads.append(f"dry-run {manifest['kind']}")
        return DryRunAnswer(status=201)

    def asked(self) -> list[tuple[str, str, str, str]]:
        """Every SubjectAccessReview sent: (user, verb, resource, name)."""
        return [
            (
                body["spec"]["user"],
                body["spec"]["resourceAttributes"]["verb"],
                body["spec"]["resourceAttributes"]["resource"],
                body["spec"]["resourceAttributes"].get("name", ""),
            )
            for body in self.authorizer.bodies
        ]

    def handlers(self) -> dict[str, Callable[..., Awaitable[None]]]:
        """The handlers as the server registers them, by webhook id."""
        registry = kopf.OperatorRegistry()
        register_admission_handlers(
            registry,
            definitions=lambda: self,
            access=lambda: self.checks,
            runs=lambda: self,
            dry_run=lambda: self,
        )
        return {handler.id: handler.fn for handler in registry._webhooks.get_all_handlers()}


async def review(
    team: Team,
    handler_id: str,
    obj: dict[str, Any],
    *,
    user: dict[str, Any] | None,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
) -> None:
    """Hand a review to the handler ``handler_id``, as kopf does; raises its refusal."""
    await team.handlers()[handler_id](
        operation=operation,
        new=obj,
        old=old,
        userinfo=user,
        dryrun=False,
        warnings=[],
        patch=kopf.Patch(),
    )


NEXT = wrap("WorkflowDefinition", definition_spec(version=2))
RUN = wrap("WorkflowRun", {"workflow": "etl", "version": 1})
RETRY = wrap("WorkflowRun", {"workflow": "etl", "version": 1, "retryOf": "nightly-42"})
FORGED = [
    (VALIDATE_DEFINITION_HANDLER_ID, NEXT),
    (VALIDATE_RUN_HANDLER_ID, RUN),
    (VALIDATE_RUN_HANDLER_ID, RETRY),
    (MUTATE_RUN_HANDLER_ID, wrap("WorkflowRun", {"workflow": "etl"})),
    (VALIDATE_SCHEDULE_HANDLER_ID, wrap("WorkflowSchedule", {"workflow": "etl"})),
    (MUTATE_SCHEDULE_HANDLER_ID, wrap("WorkflowSchedule", {"workflow": "etl"})),
    (VALIDATE_ACTION_HANDLER_ID, wrap("WorkflowRunAction", {"run": "r", "action": "Pause"})),
    (MUTATE_ACTION_HANDLER_ID, wrap("WorkflowRunAction", {"run": "r", "action": "Pause"})),
]
PLURALS = {
    "WorkflowDefinition": "workflowdefinitions",
    "WorkflowRun": "workflowruns",
    "WorkflowSchedule": "workflowschedules",
    "WorkflowRunAction": "workflowrunactions",
}


@pytest.mark.parametrize(("handler_id", "obj"), FORGED)
async def test_a_requester_who_may_not_make_the_request_is_refused_before_any_read(
    handler_id: str, obj: dict[str, Any]
) -> None:
    team = Team()
    with pytest.raises(kopf.AdmissionError) as refused:
        await review(team, handler_id, obj, user=MALLORY)
    plural = PLURALS[obj["kind"]]
    assert refused.value.code == 403
    assert (
        f"user mallory may not create {plural} in namespace {NAMESPACE} "
        f"(verb create on {plural}.flowforge.io)"
    ) in str(refused.value)
    assert team.reads == []
    asked = {("mallory", "create", plural, "")}
    if obj is RETRY:  # asked at once, with the run it retries
        asked.add(("mallory", "get", "workflowruns", "nightly-42"))
    assert set(team.asked()) == asked


async def test_a_retry_needs_get_on_the_run_it_retries() -> None:
    team = Team(*ALICE_MAY)
    with pytest.raises(kopf.AdmissionError) as refused:
        await review(team, VALIDATE_RUN_HANDLER_ID, RETRY, user=ALICE)
    assert refused.value.code == 403
    assert (
        "user alice may not get workflowruns 'nightly-42' in namespace team-a (verb get on "
        "workflowruns.flowforge.io) (named by spec.retryOf: a retry reads the run it retries)"
    ) in str(refused.value)
    assert "create workflowruns" not in str(refused.value)
    assert team.reads == []
    # allowed to read it, the retry is judged as before: the run it retries is read
    team.authorizer.grants.add(("alice", "get", "workflowruns", "nightly-42"))
    team.now += ALLOW_TTL_SECONDS  # the denial is long forgotten
    await review(team, VALIDATE_RUN_HANDLER_ID, RETRY, user=ALICE)
    assert "run nightly-42" in team.reads


async def test_an_allowed_requester_is_admitted_as_before() -> None:
    team = Team(*ALICE_MAY)
    await review(
        team,
        VALIDATE_DEFINITION_HANDLER_ID,
        NEXT,
        user=ALICE,
    )
    assert {"published versions", "policies", "dry-run Job", "dry-run Pod"} <= set(team.reads)
    team.reads.clear()
    await review(team, MUTATE_RUN_HANDLER_ID, RUN, user=ALICE)
    await review(team, VALIDATE_RUN_HANDLER_ID, RUN, user=ALICE)
    assert {"published versions", "definition", "policies"} <= set(team.reads)
    # one question about the run for both webhooks: the mutating one's answer is remembered
    assert team.asked().count(("alice", "create", "workflowruns", "")) == 1
    # and a second review of the same definition asks nothing more of the apiserver
    sent = len(team.asked())
    await review(
        team,
        VALIDATE_DEFINITION_HANDLER_ID,
        NEXT,
        user=ALICE,
    )
    assert len(team.asked()) == sent


async def test_the_answer_is_remembered_for_its_ttl_then_asked_again() -> None:
    team = Team(*ALICE_MAY)
    for _ in range(3):
        await review(team, MUTATE_RUN_HANDLER_ID, RUN, user=ALICE)
    assert team.asked() == [("alice", "create", "workflowruns", "")]
    team.now += ALLOW_TTL_SECONDS - 0.1
    await review(team, MUTATE_RUN_HANDLER_ID, RUN, user=ALICE)
    assert len(team.asked()) == 1
    team.now += 0.1
    await review(team, MUTATE_RUN_HANDLER_ID, RUN, user=ALICE)
    assert len(team.asked()) == 2
    # a revoked permission is seen once the answer is forgotten
    team.authorizer.grants.clear()
    team.now += ALLOW_TTL_SECONDS
    team.reads.clear()
    with pytest.raises(kopf.AdmissionError, match="user alice may not create workflowruns"):
        await review(
            team, MUTATE_RUN_HANDLER_ID, wrap("WorkflowRun", {"workflow": "etl"}), user=ALICE
        )
    assert team.reads == []


async def test_a_review_naming_nobody_or_not_answered_reads_nothing() -> None:
    team = Team(*ALICE_MAY)
    with pytest.raises(kopf.AdmissionError, match="names no user") as nobody:
        await review(team, VALIDATE_RUN_HANDLER_ID, RUN, user=None)
    assert nobody.value.code == 403
    team.authorizer.fail = True
    with pytest.raises(kopf.AdmissionError, match="cannot check who asks now") as down:
        await review(team, VALIDATE_RUN_HANDLER_ID, RUN, user=ALICE)
    assert down.value.code == 503
    assert team.reads == []


async def test_an_update_that_reads_nothing_asks_nothing() -> None:
    team = Team()
    cancelled = wrap("WorkflowRun", {"workflow": "etl", "version": 1, "cancel": True})
    await review(
        team, VALIDATE_RUN_HANDLER_ID, cancelled, user=MALLORY, operation="UPDATE", old=RUN
    )
    assert team.asked() == [] and team.reads == []
    # a schedule's update is checked as the run it would make: judged first
    schedule = wrap("WorkflowSchedule", {"workflow": "etl"})
    with pytest.raises(kopf.AdmissionError, match="may not update workflowschedules 'x'"):
        await review(
            team,
            VALIDATE_SCHEDULE_HANDLER_ID,
            schedule,
            user=MALLORY,
            operation="UPDATE",
            old=schedule,
        )
    assert team.reads == []
