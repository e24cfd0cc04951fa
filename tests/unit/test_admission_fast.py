"""Admission of a WorkflowDefinition with every check on, fast: one parse per review, the
checks' round trips at once but judged in their order (`operator/webhooks.py`), and the
apiserver's acceptances of dry-runs remembered briefly, per namespace (`kube/dryrun.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from flowforge.admission.access import AccessChecks
from flowforge.admission.dryrun import template_checks
from flowforge.admission.handlers import decide_definition_checks
from flowforge.admission.review import AdmissionRequest, PersistedDefinition, Verdict
from flowforge.domain import validation
from flowforge.kube.access_review import CachedAccessReviewer, UserInfo
from flowforge.kube.dryrun import CachedDryRuns, Cause, DryRunAnswer
from tests.unit.admission_fakes import (
    NAMESPACE,
    InMemoryRegistry,
    NamespaceHoldings,
    definition_spec,
    wrap,
)

ALICE = UserInfo(username="alice")
ACCEPTED = DryRunAnswer(status=201, warnings=("image tag is mutable",))
REFUSED = DryRunAnswer(
    status=422,
    message="Job is invalid",
    causes=(Cause(field="spec.template.spec.containers[0].image", message="bad image"),),
)


class Apiserver:
    """Answers dry-runs with ``answer(manifest)`` and SubjectAccessReviews from ``grants``;
    counts what it was asked. ``gate``, when set, holds every answer until it opens."""

    def __init__(self, *, answer: Any = None, grants: Sequence[str] = ("create",)) -> None:
        self.answer = answer or (lambda manifest: ACCEPTED)
        self.grants = set(grants)
        self.dry_runs: list[Mapping[str, Any]] = []
        self.reviews = 0
        self.gate: asyncio.Event | None = None
        self.waiting = 0

    async def _wait(self) -> None:
        if self.gate is not None:
            self.waiting += 1
            await self.gate.wait()

    async def create(self, manifest: Mapping[str, Any]) -> DryRunAnswer:
        self.dry_runs.append(manifest)
        await self._wait()
        answer: DryRunAnswer = self.answer(manifest)
        return answer

    async def review(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.reviews += 1
        await self._wait()
        verb = body["spec"]["resourceAttributes"]["verb"]
        return {"status": {"allowed": verb in self.grants}}

    async def list_policies(self, namespace: str) -> list[dict[str, Any]]:
        await self._wait()
        return []


class GatedRegistry(InMemoryRegistry):
    def __init__(self, apiserver: Apiserver) -> None:
        super().__init__()
        self.apiserver = apiserver

    async def persisted(
        self, *, namespace: str, workflow: str, version: int | None = None
    ) -> Sequence[PersistedDefinition]:
        await self.apiserver._wait()
        return await super().persisted(namespace=namespace, workflow=workflow, version=version)


def access(apiserver: Apiserver) -> AccessChecks:
    async def load_definition(**_: Any) -> None:
        return None

    return AccessChecks(
        reviewer=CachedAccessReviewer(apiserver.review),
        list_policies=apiserver.list_policies,
        load_definition=load_definition,
        holdings=NamespaceHoldings(),
    )


def create(spec: Any, *, namespace: str = NAMESPACE) -> AdmissionRequest:
    obj = wrap("WorkflowDefinition", spec)
    obj["metadata"]["namespace"] = namespace
    return AdmissionRequest(
        operation="CREATE", namespace=namespace, new_object=obj, old_object=None, dry_run=False
    )


async def decide(
    request: AdmissionRequest,
    apiserver: Apiserver,
    *,
    registry: InMemoryRegistry | None = None,
    warnings: list[str] | None = None,
) -> Verdict:
    return await decide_definition_checks(
        request,
        registry=registry or InMemoryRegistry(),
        user=ALICE,
        checks=access(apiserver),
        creator=apiserver,
        warnings=warnings,
    )


async def test_a_definition_is_parsed_once_for_all_its_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[object] = []
    original = validation._check  # what parse_definition runs, wherever it is imported

    def counting(spec: object) -> Any:
        parsed.append(spec)
        return original(spec)

    monkeypatch.setattr(validation, "_check", counting)
    verdict = await decide(create(definition_spec()), Apiserver())
    assert verdict.allowed
    assert len(parsed) == 1


async def test_the_round_trips_of_every_check_are_asked_at_once() -> None:
    # each answer waits until every round trip of the review is asked: one after another,
    # the first would wait for ever
    apiserver = Apiserver()
    apiserver.gate = asyncio.Event()
    review = asyncio.ensure_future(
        decide(create(definition_spec()), apiserver, registry=GatedRegistry(apiserver))
    )
    for _ in range(200):
        await asyncio.sleep(0)
    # the namespace's definitions, the policies, the SubjectAccessReview, Job and Pod dry-runs
    registry_reads, access_reads, dry_runs = 1, 2, 2
    assert apiserver.waiting == registry_reads + access_reads + dry_runs
    apiserver.gate.set()
    assert (await review).allowed


async def test_a_refusal_of_the_shape_wins_then_access_then_the_dry_run() -> None:
    refusing = Apiserver(answer=lambda manifest: REFUSED, grants=())
    warnings: list[str] = []
    gap = await decide(create(definition_spec(version=3)), refusing, warnings=warnings)
    assert not gap.allowed and gap.message.startswith("spec.version: workflow 'etl' has no ")
    no_jobs = await decide(create(definition_spec()), refusing, warnings=warnings)
    assert not no_jobs.allowed and no_jobs.code == 403
    assert "user alice may not create jobs in namespace team-a" in no_jobs.message
    only_template = Apiserver(answer=lambda manifest: REFUSED)
    verdict = await decide(create(definition_spec()), only_template, warnings=warnings)
    assert not verdict.allowed and verdict.code == 422
    assert "spec.taskTypes[py].image: bad image (the apiserver refuses the task's Job)" in (
        verdict.message
    )
    assert warnings == []
    # the dry-run warns, but the version's refusal is the answer: nobody is warned
    warned = await decide(create(definition_spec(version=3)), Apiserver(), warnings=(shown := []))
    assert not warned.allowed and shown == []
    assert (await decide(create(definition_spec()), Apiserver(), warnings=shown)).allowed
    assert shown == [
        "Job of task type py: image tag is mutable",
        "Pod of task type py: image tag is mutable",
    ]


async def test_a_spec_that_does_not_parse_asks_nobody_anything() -> None:
    apiserver = Apiserver()
    spec = definition_spec()
    spec["tasks"][1]["dependsOn"] = ["nowhere"]
    verdict = await decide(create(spec), apiserver)
    assert not verdict.allowed and "nowhere" in verdict.message
    assert (apiserver.dry_runs, apiserver.reviews) == ([], 0)


def job_of(namespace: str, image: str = "busybox:1.36") -> dict[str, Any]:
    return template_checks(namespace, {"py": {"image": image}})[0].job


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_acceptance_is_remembered_for_its_namespace_and_template_only() -> None:
    apiserver = Apiserver()
    clock = Clock()
    cached = CachedDryRuns(apiserver, ttl=10.0, clock=clock)
    assert await cached.create(job_of("team-a")) == ACCEPTED
    assert await cached.create(job_of("team-a")) == ACCEPTED
    assert len(apiserver.dry_runs) == 1
    # another namespace's identical template is another question
    await cached.create(job_of("team-b"))
    # a changed template is asked again
    await cached.create(job_of("team-a", image="busybox:1.37"))
    assert [job["metadata"]["namespace"] for job in apiserver.dry_runs] == [
        "team-a",
        "team-b",
        "team-a",
    ]
    clock.now += 10.0  # expired
    await cached.create(job_of("team-a"))
    assert len(apiserver.dry_runs) == 4


async def test_a_refusal_or_no_answer_is_never_remembered() -> None:
    answers = iter([REFUSED, DryRunAnswer(status=None, message="no answer"), ACCEPTED])
    apiserver = Apiserver(answer=lambda manifest: next(answers))
    cached = CachedDryRuns(apiserver, clock=Clock())
    results = [await cached.create(job_of("team-a")) for _ in range(4)]
    assert [answer.status for answer in results] == [422, None, 201, 201]
    assert len(apiserver.dry_runs) == 3


async def test_a_hostile_tenant_gets_no_verdict_cached_for_another_namespace() -> None:
    # team-a's template is accepted; team-b's namespace refuses the same one (its Pod
    # Security level, say): team-b is asked and refused, whatever team-a's cache holds
    apiserver = Apiserver(
        answer=lambda manifest: (
            REFUSED if manifest["metadata"]["namespace"] == "team-b" else ACCEPTED
        )
    )
    cached = CachedDryRuns(apiserver, clock=Clock())
    team_a = await decide_definition_checks(
        create(definition_spec()),
        registry=InMemoryRegistry(),
        user=ALICE,
        checks=access(apiserver),
        creator=cached,
        warnings=None,
    )
    assert team_a.allowed
    team_b = await decide_definition_checks(
        create(definition_spec(), namespace="team-b"),
        registry=InMemoryRegistry(),
        user=ALICE,
        checks=access(apiserver),
        creator=cached,
        warnings=None,
    )
    assert not team_b.allowed and "bad image" in team_b.message
    assert {job["metadata"]["namespace"] for job in apiserver.dry_runs} == {"team-a", "team-b"}
