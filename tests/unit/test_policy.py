"""The namespace policy's pure evaluation (`flowforge.domain.policy`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from flowforge.domain.caps import MAX_CONFIG_DEPTH, MAX_TASKS
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.policy import (
    Holdings,
    Policy,
    PolicySpec,
    definition_violations,
    holding_violations,
    job_refusal,
    named_service_accounts,
    parameter_violations,
    parse_image,
    policies_or_default,
    priority_violations,
    registry_allowed,
)
from flowforge.domain.validation import parse_definition


def definition(template: dict[str, Any] | None = None, **extra: Any) -> DefinitionSpec:
    spec: dict[str, Any] = {
        "workflow": "w",
        "version": 1,
        "taskTypes": {"py": {"image": "busybox:1.36", **(template or {})}},
        "tasks": [{"key": "a", "type": "py"}, {"key": "b", "type": "py", "dependsOn": ["a"]}],
        **extra,
    }
    return parse_definition(spec)


def policy(**spec: Any) -> Policy:
    return Policy(namespace="team-a", name="flowforge", spec=PolicySpec.model_validate(spec))


def messages(definition_spec: DefinitionSpec, *policies: Policy) -> list[str]:
    return [str(v) for v in definition_violations(definition_spec, list(policies))]


def test_the_default_policy_allows_the_default_account_any_registry_and_nothing_else() -> None:
    default = policies_or_default([], namespace="team-a")
    assert messages(definition({"image": "evil.io/x:1"}), *default) == []
    refused = messages(
        definition(
            {
                "serviceAccountName": "builder",
                "tolerations": [{"operator": "Exists"}],
                "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            }
        ),
        *default,
    )
    assert refused == [
        "spec.taskTypes.py.serviceAccountName: serviceaccount 'builder' is not allowed by the "
        "default policy of namespace team-a (it has no FlowForgePolicy) (its spec.serviceAccounts)",
        "spec.taskTypes.py.tolerations[0]: toleration (any key) Exists (any effect) is not "
        "allowed by the default policy of namespace team-a (it has no FlowForgePolicy)",
        "spec.taskTypes.py.nodeSelector.node-role.kubernetes.io/control-plane: node label "
        "'node-role.kubernetes.io/control-plane' is not allowed by the default policy of "
        "namespace team-a (it has no FlowForgePolicy)",
    ]


def test_a_forbidden_registry_is_named_with_the_field_and_the_policy() -> None:
    refused = messages(definition({"image": "evil.io/miner:1"}), policy(registries=["ghcr.io"]))
    assert refused == [
        "spec.taskTypes.py.image: registry evil.io is not allowed by policy team-a/flowforge "
        "(image evil.io/miner; its spec.registries)"
    ]


@pytest.mark.parametrize(
    ("image", "registry", "repository"),
    [
        ("busybox", "docker.io", "docker.io/library/busybox"),
        ("busybox:1.36", "docker.io", "docker.io/library/busybox"),
        ("acme/app", "docker.io", "docker.io/acme/app"),
        ("ghcr.io/acme/app:v1", "ghcr.io", "ghcr.io/acme/app"),
        ("GHCR.io/acme/app", "ghcr.io", "ghcr.io/acme/app"),
        ("localhost/app", "localhost", "localhost/app"),
        ("registry:5000/app", "registry:5000", "registry:5000/app"),
        ("evil.io/x@sha256:" + "a" * 64, "evil.io", "evil.io/x"),
    ],
)
def test_images_are_read_as_the_kubelet_pulls_them(
    image: str, registry: str, repository: str
) -> None:
    reference = parse_image(image)
    assert reference is not None
    assert (reference.registry, reference.repository) == (registry, repository)


@pytest.mark.parametrize(
    "image", ["", "UPPER/app", "a//b", "docker.io/../evil", "evil.io/x y", "x:tag:tag", "/x"]
)
def test_an_image_that_is_no_reference_is_refused_when_registries_are_limited(
    image: str,
) -> None:
    assert parse_image(image) is None
    template = definition().task_types["py"].model_copy(update={"image": image})
    spec = definition().model_copy(update={"task_types": {"py": template}})
    assert messages(spec, policy(registries=["docker.io"])) == [
        "spec.taskTypes.py.image: is not a valid image reference (policy team-a/flowforge "
        "allows only some registries)"
    ]


def test_glob_patterns_match_the_host_without_a_slash_and_the_repository_with_one() -> None:
    busybox = parse_image("busybox")
    acme = parse_image("ghcr.io/acme/app")
    assert busybox is not None and acme is not None
    assert registry_allowed(busybox, ["docker.io"])
    assert registry_allowed(busybox, ["docker.io/library/*"])
    assert not registry_allowed(busybox, ["docker.io/acme/*"])
    assert registry_allowed(acme, ["*.io"]) and not registry_allowed(acme, ["ghcr.io/other/*"])
    # a host pattern never matches a longer host that merely starts like it
    lookalike = parse_image("ghcr.io.evil.com/acme/app")
    assert lookalike is not None and not registry_allowed(lookalike, ["ghcr.io"])


def test_tolerations_and_node_selectors_pass_only_as_listed() -> None:
    allowed = policy(
        tolerations=[{"key": "gpu", "values": ["a100"], "effects": ["NoSchedule"]}],
        nodeSelector={"pool": ["batch", "spot"], "zone": ["*"]},
    )
    ok = definition(
        {
            "tolerations": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "spot", "zone": "eu-1"},
        }
    )
    assert messages(ok, allowed) == []
    bad = definition(
        {
            "tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "gpu", "value": "a100"},
                {"operator": "Exists"},
            ],
            "nodeSelector": {"pool": "system"},
        }
    )
    paths = [v.path for v in definition_violations(bad, [allowed])]
    assert paths == [
        "spec.taskTypes.py.tolerations[0]",
        "spec.taskTypes.py.tolerations[1]",
        "spec.taskTypes.py.tolerations[2]",
        "spec.taskTypes.py.nodeSelector.pool",
    ]


def test_caps_lower_the_hard_limits_and_name_the_field() -> None:
    strict = policy(caps={"maxTasks": 1, "maxEdges": 0, "maxConfigDepth": 2})
    spec = definition(
        tasks=[
            {"key": "a", "type": "py", "config": {"x": {"y": {"z": 1}}}},
            {"key": "b", "type": "py", "dependsOn": ["a"]},
        ]
    )
    assert messages(spec, strict) == [
        "spec.tasks: has 2 tasks; policy team-a/flowforge allows at most 1",
        "spec.tasks: has 1 dependsOn entries in total; policy team-a/flowforge allows at most 0",
        "spec.tasks[0].config: has 3 levels of nesting; policy team-a/flowforge allows at most 2",
    ]
    assert [
        str(v)
        for v in parameter_violations(
            {"a": "xyz"}, [policy(caps={"maxParameters": 0, "maxParameterValueLength": 2})]
        )
    ] == [
        "spec.parameters: has 1 parameters; policy team-a/flowforge allows at most 0",
        "spec.parameters[a]: has 3 characters; policy team-a/flowforge allows at most 2",
    ]


@pytest.mark.parametrize(
    "caps", [{"maxTasks": MAX_TASKS + 1}, {"maxConfigDepth": MAX_CONFIG_DEPTH + 1}, {"x": 1}]
)
def test_a_policy_cannot_raise_a_hard_limit_or_invent_a_cap(caps: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        PolicySpec.model_validate({"caps": caps})


def test_only_service_accounts_other_than_default_need_use() -> None:
    spec = parse_definition(
        {
            "workflow": "w",
            "version": 1,
            "taskTypes": {
                "a": {"image": "x", "serviceAccountName": "builder"},
                "b": {"image": "x", "serviceAccountName": "default"},
                "c": {"image": "x"},
            },
            "tasks": [{"key": "t", "type": "a"}],
        }
    )
    assert named_service_accounts(spec) == [("spec.taskTypes.a.serviceAccountName", "builder")]


accounts = st.lists(st.sampled_from(["default", "builder", "deployer", "ci"]), max_size=4)


@given(first=accounts, second=accounts, used=st.sampled_from(["builder", "deployer", "ci"]))
def test_every_policy_applies_so_adding_one_never_allows_more(
    first: list[str], second: list[str], used: str
) -> None:
    spec = definition({"serviceAccountName": used})
    one = definition_violations(spec, [policy(serviceAccounts=first)])
    both = definition_violations(
        spec,
        [
            policy(serviceAccounts=first),
            Policy(namespace="team-a", name="p2", spec=PolicySpec(service_accounts=second)),
        ],
    )
    assert (not one) == (used in first)
    assert (not both) == (used in first and used in second)
    assert set(one) <= set(both)


@given(
    st.integers(min_value=1, max_value=MAX_CONFIG_DEPTH),
    st.integers(min_value=1, max_value=MAX_CONFIG_DEPTH),
)
def test_a_config_passes_exactly_when_it_fits_the_depth_cap(depth: int, cap: int) -> None:
    config: dict[str, Any] = {}
    cursor = config
    for _ in range(depth - 1):
        cursor["n"] = {}
        cursor = cursor["n"]
    spec = definition(tasks=[{"key": "a", "type": "py", "config": config}])
    found = definition_violations(spec, [policy(caps={"maxConfigDepth": cap})])
    assert (not found) == (depth <= cap)


def test_init_container_and_sidecar_images_are_held_to_the_registries() -> None:
    spec = definition(
        {
            "image": "ghcr.io/acme/app:1",
            "initContainers": [
                {"name": "fetch", "image": "evil.io/fetch:1"},
                {"name": "proxy", "image": "ghcr.io/acme/proxy:1", "restartPolicy": "Always"},
                {"name": "miner", "image": "busybox", "restartPolicy": "Always"},
            ],
        }
    )
    assert messages(spec, policy(registries=["ghcr.io/acme/*"])) == [
        "spec.taskTypes.py.initContainers[0].image: registry evil.io is not allowed by policy "
        "team-a/flowforge (image evil.io/fetch; its spec.registries)",
        "spec.taskTypes.py.initContainers[2].image: registry docker.io is not allowed by "
        "policy team-a/flowforge (image docker.io/library/busybox; its spec.registries)",
    ]
    assert messages(spec, policy()) == []  # any registry by default


@pytest.mark.parametrize("image", [None, "", 7, "EVIL.io/../x", "ghcr.io/acme/app\n"])
def test_an_init_container_image_that_is_no_reference_is_refused(image: object) -> None:
    """Hostile documents that never passed the schema (a stored definition, a newer
    writer): an image missing, empty, of another type or no reference is refused."""
    template = (
        definition()
        .task_types["py"]
        .model_copy(update={"init_containers": ({"name": "x", "image": image},)})
    )
    spec = definition().model_copy(update={"task_types": {"py": template}})
    assert messages(spec, policy(registries=["docker.io"])) == [
        "spec.taskTypes.py.initContainers[0].image: is not a valid image reference (policy "
        "team-a/flowforge allows only some registries)"
    ]


def kueue_definition(**kueue: Any) -> DefinitionSpec:
    """Task type ``own`` names its own queue and class, ``inherits`` takes the defaults."""
    own = {key: kueue.pop(key) for key in ("queueName", "workloadPriorityClass") if key in kueue}
    return parse_definition(
        {
            "workflow": "w",
            "version": 1,
            "taskTypes": {"own": {"image": "x", **own}, "inherits": {"image": "x"}},
            "tasks": [{"key": "a", "type": "own"}, {"key": "b", "type": "inherits"}],
            **kueue,
        }
    )


def test_kueue_queues_and_priority_classes_are_refused_where_they_are_named() -> None:
    strict = policy(queues=["team-a-*"], workloadPriorityClasses=["batch-*"])
    spec = kueue_definition(queueName="team-b-gpu", workloadPriorityClass="critical")
    assert messages(spec, strict) == [
        "spec.taskTypes.own.queueName: LocalQueue 'team-b-gpu' is not allowed by policy "
        "team-a/flowforge",
        "spec.taskTypes.own.workloadPriorityClass: WorkloadPriorityClass 'critical' is not "
        "allowed by policy team-a/flowforge",
    ]
    # the definition's defaults are named once, however many task types take them
    inherited = parse_definition(
        {
            "workflow": "w",
            "version": 1,
            "queueName": "shared",
            "workloadPriorityClass": "urgent",
            "taskTypes": {"a": {"image": "x"}, "b": {"image": "x"}},
            "tasks": [{"key": "a", "type": "a"}, {"key": "b", "type": "b"}],
        }
    )
    assert messages(inherited, strict) == [
        "spec.queueName: LocalQueue 'shared' is not allowed by policy team-a/flowforge",
        "spec.workloadPriorityClass: WorkloadPriorityClass 'urgent' is not allowed by policy "
        "team-a/flowforge",
    ]
    ok = kueue_definition(queueName="team-a-cpu", workloadPriorityClass="batch-low")
    assert messages(ok, strict) == []
    assert messages(spec, policy()) == []  # any queue and class by default


def test_a_policy_may_require_every_task_type_to_queue_through_kueue() -> None:
    required = policy(queueRequired=True)
    spec = kueue_definition(queueName="team-a")
    assert messages(spec, required) == [
        "spec.taskTypes.inherits.queueName: names no Kueue queue (nor does spec.queueName); "
        "policy team-a/flowforge requires one"
    ]
    both = parse_definition(
        {
            "workflow": "w",
            "version": 1,
            "queueName": "team-a",
            "taskTypes": {"a": {"image": "x"}},
            "tasks": [{"key": "a", "type": "a"}],
        }
    )
    assert messages(both, required) == []


@pytest.mark.parametrize(
    ("priority", "refused"),
    [(10, False), (11, True), (-1_000_000, False), (10**30, True), (-(10**30), False)],
)
def test_a_runs_priority_above_the_policys_max_is_refused(priority: int, refused: bool) -> None:
    found = [str(v) for v in priority_violations(priority, [policy(maxPriority=10)])]
    expected = [
        f"spec.priority: priority {priority} is higher than policy team-a/flowforge allows "
        "(maxPriority 10)"
    ]
    assert found == (expected if refused else [])
    assert priority_violations(priority, [policy()]) == []  # no maxPriority: no limit here


def test_the_lowest_cap_on_what_a_namespace_holds_refuses_each_policy_it_passes() -> None:
    loose = policy(maxQueuedRuns=10, maxTaskRows=50_000)
    tight = Policy(
        namespace="team-a",
        name="tight",
        spec=PolicySpec.model_validate({"maxQueuedRuns": 2, "maxTaskRows": 20_000}),
    )
    held = Holdings(queued_runs=2, task_rows=15_000)
    found = [str(v) for v in holding_violations(held, rows=10_000, policies=[loose, tight])]
    assert found == [
        "spec: 2 runs of the namespace are queued; policy team-a/tight allows at most 2 "
        "(maxQueuedRuns): try again when runs have left the queue",
        "spec: the run has 10000 task rows and the namespace's unfinished runs hold 15000; "
        "policy team-a/tight allows at most 20000 (maxTaskRows)",
    ]
    assert holding_violations(held, rows=5_000, policies=[loose]) == []
    assert holding_violations(Holdings(10**6, 10**9), rows=10**4, policies=[policy()]) == []


@pytest.mark.parametrize(
    "spec",
    [
        {"maxQueuedRuns": 0},
        {"maxQueuedRuns": -1},
        {"maxTaskRows": 0},
        {"maxTaskRows": "many"},
        {"maxPriority": 1_000_001},
        {"maxPriority": "high"},
        {"queues": [""]},
        {"queues": "team-a"},
        {"workloadPriorityClasses": ["x" * 513]},
        {"queueRequired": [True]},
    ],
)
def test_hostile_kueue_and_priority_policy_fields_are_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        PolicySpec.model_validate(spec)


def test_a_jobs_refusal_names_each_violation_and_an_unreadable_policy_refuses_all() -> None:
    spec = definition(
        {
            "image": "evil.io/a:1",
            "initContainers": [
                {"name": f"c{index}", "image": f"evil.io/c{index}:1"} for index in range(6)
            ],
        }
    )
    strict = [policy(registries=["ghcr.io"])]
    refusal = job_refusal(spec, "py", namespace="team-a", policies=strict, problems=[])
    assert refusal is not None
    assert refusal.startswith("spec.taskTypes.py.image: registry evil.io is not allowed")
    assert "spec.taskTypes.py.initContainers[3].image" in refusal
    assert refusal.endswith("; ... and 2 more")  # 7 violations, 5 named
    assert job_refusal(definition(), "py", namespace="team-a", policies=[], problems=[]) is None
    broken = "FlowForgePolicy team-a/p is invalid (spec.caps: ...); nothing runs"
    assert (
        job_refusal(definition(), "py", namespace="team-a", policies=[], problems=[broken])
        == broken
    )


def test_the_jobs_check_and_admissions_are_one_check() -> None:
    """Every violation admission names for a task type is what a Job of it is refused for."""
    spec = kueue_definition(queueName="team-b", workloadPriorityClass="urgent")
    strict = [policy(queues=["team-a"], workloadPriorityClasses=["low"], registries=["ghcr.io"])]
    for name in spec.task_types:
        expected = [str(v) for v in definition_violations(spec, strict) if f".{name}." in v.path]
        refusal = job_refusal(spec, name, namespace="team-a", policies=strict, problems=[])
        assert refusal is not None
        assert all(line in refusal for line in expected) and expected
