"""The pure rules of the run limits (``domain/queue.py``) and their admission check."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.admission.review import RetrySource, decide_run_limits
from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.policy_spec import PolicySpec
from flowforge.domain.queue import (
    NamespaceLimits,
    QueueReason,
    concurrency_key,
    namespace_limits,
    queue_message,
    run_parallelism,
)
from flowforge.domain.validation import parse_definition
from tests.unit.admission_fakes import create, definition_spec, wrap


def spec(**limits: Any) -> dict[str, Any]:
    return {**definition_spec(), **limits}


class Running:
    def __init__(self, count: int) -> None:
        self.count = count
        self.asked: list[tuple[str, str]] = []

    async def run_named(self, *, namespace: str, name: str) -> RetrySource | None:
        return None

    async def running_runs(self, *, namespace: str, key: str) -> int:
        self.asked.append((namespace, key))
        return self.count


def test_every_policy_applies_so_each_limit_is_the_lowest() -> None:
    policies = [
        PolicySpec.model_validate({"maxRunningRuns": 5, "caps": {"maxParallelTasks": 8}}),
        PolicySpec.model_validate({"maxRunningRuns": 3, "maxRunningTasks": 40}),
        PolicySpec(),
    ]
    assert namespace_limits(policies) == NamespaceLimits(
        max_running_runs=3, max_running_tasks=40, max_parallel_tasks=8
    )
    assert namespace_limits([]) == NamespaceLimits()


def test_the_key_is_the_workflow_and_the_key_parameters_values() -> None:
    keyed = parse_definition(spec(concurrency={"maxRuns": 1, "key": ["tenant", "region"]}))
    one = concurrency_key(keyed, {"tenant": "a", "region": "eu", "date": "1"})
    assert one == concurrency_key(keyed, {"region": "eu", "tenant": "a", "date": "2"})
    assert one != concurrency_key(keyed, {"tenant": "a", "region": "us"})
    # values that would read alike joined by a separator stay apart
    assert concurrency_key(keyed, {"tenant": "a,b", "region": ""}) != concurrency_key(
        keyed, {"tenant": "a", "region": "b,"}
    )
    assert concurrency_key(parse_definition(spec(concurrency={"maxRuns": 2})), {}) == "etl"
    assert concurrency_key(parse_definition(spec()), {}) is None


def test_a_run_lowers_the_definition_s_parallelism_never_raises_it() -> None:
    limited = parse_definition(spec(maxParallelTasks=5))
    assert run_parallelism(limited, None) == 5
    assert run_parallelism(limited, 3) == 3
    assert run_parallelism(parse_definition(spec()), 3) == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("maxParallelTasks", 0),
        ("concurrency", {"maxRuns": 0}),
        ("concurrency", {"maxRuns": 1, "policy": "Drop"}),
        ("concurrency", {"maxRuns": 1, "key": []}),
        ("concurrency", {"key": ["tenant"]}),
        ("concurrency", {"maxRuns": 1, "extra": True}),
    ],
)
def test_hostile_limits_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidDefinitionError) as raised:
        parse_definition(spec(**{field: value}))
    assert f"spec.{field}" in str(raised.value)


def test_the_queued_message_names_the_limit_and_the_position() -> None:
    text = queue_message(QueueReason.NAMESPACE_RUN_LIMIT, position=2, queued=7, limit=3)
    assert (
        text
        == "waiting for the namespace's maxRunningRuns (3): position 2 of 7 queued in the namespace"
    )


async def test_forbid_refuses_a_run_over_the_limit_and_says_why() -> None:
    definition = parse_definition(
        spec(concurrency={"maxRuns": 1, "key": ["tenant"], "policy": "Forbid"})
    )
    run = wrap("WorkflowRun", {"workflow": "etl", "version": 1, "parameters": {"tenant": "a"}})
    busy = Running(1)
    verdict = await decide_run_limits(create(run), definition=definition, runs=busy)
    assert not verdict.allowed and verdict.code == 409
    assert "workflow etl with tenant=a already has 1 runs running or queued" in verdict.message
    assert busy.asked == [("team-a", concurrency_key(definition, {"tenant": "a"}))]
    assert (await decide_run_limits(create(run), definition=definition, runs=Running(0))).allowed


async def test_queue_and_replace_admit_a_run_over_the_limit() -> None:
    for policy in ("Queue", "Replace"):
        definition = parse_definition(spec(concurrency={"maxRuns": 1, "policy": policy}))
        run = wrap("WorkflowRun", {"workflow": "etl", "version": 1})
        assert (
            await decide_run_limits(create(run), definition=definition, runs=Running(9))
        ).allowed


async def test_a_run_may_not_raise_parallelism_or_leave_out_a_key_parameter() -> None:
    definition = parse_definition(
        spec(maxParallelTasks=4, concurrency={"maxRuns": 1, "key": ["tenant"]})
    )
    run = wrap("WorkflowRun", {"workflow": "etl", "version": 1, "maxParallelTasks": 9})
    verdict = await decide_run_limits(create(run), definition=definition, runs=Running(0))
    assert not verdict.allowed
    assert "spec.maxParallelTasks: 9 is above the definition's spec.maxParallelTasks (4)" in (
        verdict.message
    )
    assert "spec.parameters.tenant: required" in verdict.message
