"""How admission reads the apiserver's answers to the dry-runs of a definition's templates.

The answers are scripted here (the real apiserver gives them in
tests/cluster/test_task_templates.py); what is decided from them is pure.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from flowforge.admission.dryrun import MAX_TEMPLATES, DryRunBudget, decide_definition_dry_run
from flowforge.admission.review import AdmissionRequest
from flowforge.kube.dryrun import Cause, DryRunAnswer


class Scripted:
    """Answers each dry-run with ``answer(manifest)``; counts calls and overlap."""

    def __init__(self, answer: Any, *, delay: float = 0.0) -> None:
        self.answer = answer
        self.delay = delay
        self.kinds: list[str] = []
        self.running = 0
        self.most = 0

    async def create(self, manifest: Mapping[str, Any]) -> DryRunAnswer:
        self.kinds.append(str(manifest["kind"]))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay)
            answer: DryRunAnswer = self.answer(manifest)
            return answer
        finally:
            self.running -= 1


def review(task_types: dict[str, Any], operation: str = "CREATE") -> AdmissionRequest:
    spec = {"workflow": "w", "version": 1, "taskTypes": task_types,
            "tasks": [{"key": "a", "type": next(iter(task_types))}]}  # fmt: skip
    return AdmissionRequest(operation=operation, namespace="team-a",
                            new_object={"spec": spec}, old_object=None, dry_run=False)  # fmt: skip


def decide(request: AdmissionRequest, creator: Scripted, **options: Any) -> Any:
    return asyncio.run(decide_definition_dry_run(request, creator=creator, **options))


OK = DryRunAnswer(status=201)


def test_identical_task_types_share_one_job_and_one_pod_dry_run() -> None:
    creator = Scripted(lambda manifest: OK)
    types = {name: {"image": "busybox:1.36"} for name in ("a", "b", "c")}
    types["d"] = {"image": "python:3.12"}
    assert decide(review(types), creator).allowed
    assert sorted(creator.kinds) == ["Job", "Job", "Pod", "Pod"]


def test_at_most_the_concurrency_runs_at_once() -> None:
    creator = Scripted(lambda manifest: OK, delay=0.01)
    types = {f"t{i}": {"image": f"busybox:{i}"} for i in range(12)}
    assert decide(review(types), creator, concurrency=3).allowed
    assert len(creator.kinds) == 24 and creator.most == 3


def test_a_refusal_names_the_field_of_every_task_type_sharing_the_template() -> None:
    cause = Cause(field="spec.template.spec.containers[0].env[0].name", message="Invalid value")
    refusal = DryRunAnswer(status=422, message="invalid", causes=(cause,))
    creator = Scripted(lambda manifest: refusal if manifest["kind"] == "Job" else OK)
    template = {"image": "x", "env": [{"name": "A"}]}
    verdict = decide(review({"a": template, "b": template}), creator)
    assert not verdict.allowed and verdict.code == 422
    assert "spec.taskTypes[a].env[0].name: Invalid value" in verdict.message
    assert "spec.taskTypes[b].env[0].name: Invalid value" in verdict.message


def test_the_pod_is_not_reported_again_when_the_job_says_it() -> None:
    cause = Cause(field="spec.template.spec.volumes[0].name", message="Invalid value")
    pod_cause = Cause(field="spec.volumes[0].name", message="Invalid value")
    creator = Scripted(
        lambda manifest: DryRunAnswer(status=422, message="invalid",
                                      causes=(cause if manifest["kind"] == "Job" else pod_cause,))
    )  # fmt: skip
    verdict = decide(review({"a": {"image": "x"}}), creator)
    assert verdict.message.count("spec.taskTypes[a].volumes[0].name") == 1


def test_pod_security_names_the_task_type_and_the_apiservers_words() -> None:
    words = 'pods "x" is forbidden: violates PodSecurity "restricted:latest": runAsUser=0'
    creator = Scripted(
        lambda manifest: OK if manifest["kind"] == "Job" else DryRunAnswer(403, words)
    )
    verdict = decide(review({"a": {"image": "x"}}), creator)
    assert not verdict.allowed
    assert f"spec.taskTypes[a]: the apiserver refuses the task's Pod: {words}" in verdict.message


def test_a_missing_service_account_names_the_field() -> None:
    words = 'error looking up service account team-a/builder: serviceaccount "builder" not found'
    creator = Scripted(
        lambda manifest: OK if manifest["kind"] == "Job" else DryRunAnswer(403, words)
    )
    verdict = decide(review({"a": {"image": "x", "serviceAccountName": "builder"}}), creator)
    assert "spec.taskTypes[a].serviceAccountName: the apiserver refuses" in verdict.message


def test_a_quota_exceeded_now_is_a_warning_not_a_refusal() -> None:
    words = (
        'pods "x" is forbidden: exceeded quota: q, requested: pods=1, used: pods=4, limited: pods=4'
    )
    creator = Scripted(
        lambda manifest: OK if manifest["kind"] == "Job" else DryRunAnswer(403, words)
    )
    warnings: list[str] = []
    assert decide(review({"a": {"image": "x"}}), creator, warnings=warnings).allowed
    assert warnings == [f"Pod of task type a not checked now: {words}"]


def test_warnings_of_the_apiserver_reach_the_review() -> None:
    warned = DryRunAnswer(status=201, warnings=('would violate PodSecurity "baseline:latest"',))
    creator = Scripted(lambda manifest: warned)
    warnings: list[str] = []
    assert decide(review({"a": {"image": "x"}}), creator, warnings=warnings).allowed
    assert warnings == [
        'Job of task type a: would violate PodSecurity "baseline:latest"',
        'Pod of task type a: would violate PodSecurity "baseline:latest"',
    ]


@pytest.mark.parametrize(
    "answer", [DryRunAnswer(status=None, message="no answer"), DryRunAnswer(500, "etcd")]
)
def test_an_apiserver_in_trouble_refuses_with_503(answer: DryRunAnswer) -> None:
    verdict = decide(review({"a": {"image": "x"}}), Scripted(lambda manifest: answer))
    assert not verdict.allowed and verdict.code == 503
    assert verdict.message.startswith("cannot check the task types now:")


def test_a_dry_run_slower_than_the_timeout_refuses_in_time() -> None:
    verdict = decide(review({"a": {"image": "x"}}), Scripted(lambda m: OK, delay=5), timeout=0.2)
    assert not verdict.allowed and verdict.code == 503
    assert "within 0.2 s" in verdict.message


def test_only_a_create_is_dry_run() -> None:
    creator = Scripted(lambda manifest: DryRunAnswer(422, "no"))
    assert decide(review({"a": {"image": "x"}}, operation="UPDATE"), creator).allowed
    assert creator.kinds == []


def distinct(count: int) -> dict[str, Any]:
    return {f"t{index}": {"image": f"busybox:1.{index}"} for index in range(count)}


def test_a_definition_with_more_distinct_templates_than_the_bound_gets_no_dry_run() -> None:
    creator = Scripted(lambda manifest: OK)
    # the forged definition that once caused 512 dry-run creations
    verdict = decide(review(distinct(256)), creator)
    assert not verdict.allowed and verdict.code == 422
    assert verdict.message.startswith("spec.taskTypes: 256 distinct task templates; at most 16")
    assert creator.kinds == []
    # identical task types share one template: they never count against the bound
    many_names = {f"t{index}": {"image": "busybox:1.36"} for index in range(256)}
    assert decide(review({**many_names, **distinct(MAX_TEMPLATES - 1)}), creator).allowed
    assert len(creator.kinds) == 2 * MAX_TEMPLATES


def test_each_requester_has_a_budget_of_dry_runs_refilled_over_a_minute() -> None:
    now = [1000.0]
    budget = DryRunBudget(per_minute=64, clock=lambda: now[0])
    creator = Scripted(lambda manifest: OK)

    def by(user: str) -> Any:
        request = dataclasses.replace(review(distinct(8)), user=user)
        return decide(request, creator, budget=budget)

    for _ in range(4):  # 8 templates: 16 dry-runs each
        assert by("mallory").allowed
    assert len(creator.kinds) == 64
    refused = by("mallory")
    assert not refused.allowed and refused.code == 429
    assert "mallory may cause 64 dry-run creations a minute" in refused.message
    assert "needs 16; try again in 15 s" in refused.message
    assert len(creator.kinds) == 64  # refused before anything was asked
    assert by("alice").allowed  # another requester's budget is their own
    now[0] += 14.0
    assert not by("mallory").allowed
    now[0] += 1.0
    assert by("mallory").allowed


def test_the_budget_remembers_a_bounded_number_of_requesters() -> None:
    now = [0.0]
    budget = DryRunBudget(per_minute=10, clock=lambda: now[0], max_requesters=3)
    assert budget.take("mallory", 10) is None
    for user in ("a", "b", "c", "d", "e"):  # each still holds its whole budget
        assert budget.take(user, 0) is None
    assert len(budget._buckets) <= 3
    # full buckets are forgotten first: the spent one is still remembered
    assert budget.take("mallory", 1) == 6.0
