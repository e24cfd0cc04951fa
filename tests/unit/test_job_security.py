"""Every Job gets restricted pod defaults (Pod Security `restricted`) and no token unless asked."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.policy import Policy, definition_violations
from flowforge.domain.states import TaskRole
from flowforge.domain.validation import parse_definition
from flowforge.kube.jobs import JobRequest, build_job


def pod_of(template: dict[str, Any]) -> dict[str, Any]:
    request = JobRequest(
        namespace="team-a",
        run_name="r",
        run_uid="uid",
        task_key="t",
        attempt=1,
        role=TaskRole.FORWARD,
        template=template,
    )
    spec: dict[str, Any] = build_job(request)["spec"]["template"]["spec"]
    return spec


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """The checks of the Pod Security Standard `restricted` (v1.34) a Pod spec fails."""
    problems = []
    pod_context = pod.get("securityContext") or {}
    for container in pod["containers"]:
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append("allowPrivilegeEscalation != false")
        if (context.get("capabilities") or {}).get("drop") != ["ALL"]:
            problems.append("capabilities.drop != [ALL]")
        if set((context.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append("capabilities added")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            problems.append("runAsNonRoot != true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append("runAsUser = 0")
        profile = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
        if profile.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append("seccompProfile")
        if context.get("privileged"):
            problems.append("privileged")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    return problems


@pytest.mark.parametrize(
    "template",
    [
        {"image": "busybox:1.36"},
        {"image": "busybox:1.36", "serviceAccountName": "builder", "command": ["sh"]},
        {"image": "busybox:1.36", "automountServiceAccountToken": True},
    ],
)
def test_every_job_passes_pod_security_restricted(template: dict[str, Any]) -> None:
    assert restricted_problems(pod_of(template)) == []


def test_the_token_is_mounted_only_when_the_task_type_asks() -> None:
    assert pod_of({"image": "x"})["automountServiceAccountToken"] is False
    assert (
        pod_of({"image": "x", "automountServiceAccountToken": False})[
            "automountServiceAccountToken"
        ]
        is False
    )
    assert (
        pod_of({"image": "x", "automountServiceAccountToken": True})["automountServiceAccountToken"]
        is True
    )
    # anything but a literal true (a string from a hand-written template) mounts nothing
    assert (
        pod_of({"image": "x", "automountServiceAccountToken": "true"})[
            "automountServiceAccountToken"
        ]
        is False
    )


def test_pods_of_one_job_do_not_share_the_defaults_by_reference() -> None:
    first = pod_of({"image": "x"})
    first["securityContext"]["runAsUser"] = 0
    first["containers"][0]["securityContext"]["capabilities"]["drop"].clear()
    assert restricted_problems(pod_of({"image": "x"})) == []


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"image": "x", "securityContext": {"privileged": True}}, "securityContext.privileged"),
        ({"image": "x", "hostNetwork": True}, "hostNetwork"),
        (
            {"image": "x", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
            "securityContext.capabilities.add[0]",
        ),
        ({"image": "x", "podSecurityContext": {"runAsUser": 0}}, "podSecurityContext.runAsUser"),
        (
            {"image": "x", "volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]},
            "volumes[0].hostPath",
        ),
    ],
)
def test_the_default_policy_refuses_what_loosens_the_pod(
    template: dict[str, Any], field: str
) -> None:
    spec = {"workflow": "w", "version": 1, "taskTypes": {"t": template},
            "tasks": [{"key": "a", "type": "t"}]}  # fmt: skip
    violations = definition_violations(parse_definition(spec), [Policy.default("team-a")])
    assert [violation.path for violation in violations] == [f"spec.taskTypes.t.{field}"]


def test_a_template_cannot_say_what_the_schema_refuses() -> None:
    spec = {"workflow": "w", "version": 1,
            "taskTypes": {"t": {"image": "x", "automountServiceAccountToken": "yes"}},
            "tasks": [{"key": "a", "type": "t"}]}  # fmt: skip
    with pytest.raises(InvalidDefinitionError) as caught:
        parse_definition(spec)
    assert "spec.taskTypes[t].automountServiceAccountToken" in str(caught.value)


@pytest.mark.parametrize(
    "template",
    [
        {"image": "x", "securityContext": {"capabilities": {"drop": []}, "runAsUser": 1000}},
        {"image": "x", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}},
        {"image": "x", "podSecurityContext": {"runAsUser": 1000, "fsGroup": 2000}},
        {
            "image": "x",
            "initContainers": [
                {"name": "proxy", "image": "envoy", "restartPolicy": "Always"},
            ],
        },
    ],
)
def test_a_template_security_context_keeps_the_restricted_defaults(
    template: dict[str, Any],
) -> None:
    pod = pod_of(template)
    assert restricted_problems(pod) == []
    for container in pod.get("initContainers", []):
        assert restricted_problems({**pod, "containers": [container]}) == []
