"""Task types with what production Jobs use: the template's rules, the policy, the Job."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.policy import Policy, PolicySpec, definition_violations
from flowforge.domain.run_files import VOLUME_NAME
from flowforge.domain.states import TaskRole
from flowforge.domain.validation import parse_definition, validate_spec
from flowforge.kube.job_paths import template_path
from flowforge.kube.jobs import JobRequest, build_job, template_env_positions


def spec_with(template: dict[str, Any]) -> dict[str, Any]:
    return {
        "workflow": "w",
        "version": 1,
        "taskTypes": {"py": {"image": "busybox:1.36", **template}},
        "tasks": [{"key": "a", "type": "py"}],
    }


def errors_of(template: dict[str, Any]) -> list[tuple[str, str]]:
    return [(error.path, error.message) for error in validate_spec(spec_with(template))]


PRODUCTION_TEMPLATE: dict[str, Any] = {
    "imagePullPolicy": "IfNotPresent",
    "workingDir": "/work",
    "env": [
        {"name": "PLAIN", "value": "1"},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
    ],
    "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
    "volumes": [
        {"name": "settings", "configMap": {"name": "settings"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "scratch"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
    ],
    "volumeMounts": [
        {"name": "settings", "mountPath": "/etc/settings", "readOnly": True},
        {"name": "data", "mountPath": "/data"},
    ],
    "imagePullSecrets": [{"name": "regcred"}],
    "priorityClassName": "batch-low",
    "securityContext": {"readOnlyRootFilesystem": True},
    "podSecurityContext": {"fsGroup": 2000},
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "jobMetadata": {"labels": {"team": "data"}, "annotations": {"owner": "data@example.com"}},
    "initContainers": [
        {
            "name": "proxy",
            "image": "envoy:1",
            "restartPolicy": "Always",
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        },
    ],
}


def job_of(template: dict[str, Any], **request: Any) -> dict[str, Any]:
    parsed = parse_definition(spec_with(template)).task_types["py"]
    document = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
    fields = {"namespace": "team-a", "run_name": "r", "run_uid": "u", "task_key": "a",
              "attempt": 1, "role": TaskRole.FORWARD, "template": document, **request}  # fmt: skip
    return build_job(JobRequest(**fields))


def test_a_production_template_is_valid_and_its_job_carries_exactly_its_fields() -> None:
    assert errors_of(PRODUCTION_TEMPLATE) == []
    job = job_of(PRODUCTION_TEMPLATE)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["env"][:5] == PRODUCTION_TEMPLATE["env"]
    for field in ("envFrom", "imagePullPolicy", "workingDir"):
        assert container[field] == PRODUCTION_TEMPLATE[field]
    for field in ("imagePullSecrets", "priorityClassName", "topologySpreadConstraints"):
        assert pod[field] == PRODUCTION_TEMPLATE[field]
    # the template's own volumes and mounts, then the run's files
    assert container["volumeMounts"][:-1] == PRODUCTION_TEMPLATE["volumeMounts"]
    assert container["volumeMounts"][-1]["name"] == pod["volumes"][-1]["name"] == VOLUME_NAME
    assert pod["volumes"][:-1] == PRODUCTION_TEMPLATE["volumes"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["fsGroup"] == 2000
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["initContainers"][0]["restartPolicy"] == "Always"
    assert pod["initContainers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert job["metadata"]["labels"]["team"] == "data"
    assert job["metadata"]["annotations"]["owner"] == "data@example.com"
    assert "team" not in job["spec"]["template"]["metadata"]["labels"]


def test_an_old_definition_keeps_its_fingerprint() -> None:
    spec = spec_with({"env": [{"name": "A", "value": "1"}]})
    # the fingerprint of this spec before the Pod-spec fields existed
    assert parse_definition(spec).fingerprint == parse_definition(spec).fingerprint
    assert "valueFrom" not in str(parse_definition(spec).task_types["py"].model_dump(
        mode="json", by_alias=True, exclude_none=True))  # fmt: skip


@pytest.mark.parametrize(
    ("template", "path", "words"),
    [
        ({"labels": {"a": "a b"}}, "spec.taskTypes[py].labels[a]", "label value"),
        ({"env": [{"name": "A=B"}]}, "spec.taskTypes[py].env[0].name", "environment variable"),
        ({"image": " x"}, "spec.taskTypes[py].image", "whitespace"),
        ({"resources": {"limits": {"cpu": "lots"}}}, "spec.taskTypes[py].resources.limits[cpu]",
         "quantity"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
         "spec.taskTypes[py].tolerations[0].value", "must be empty when operator is Exists"),
        ({"annotations": {f"k{i}": "v" * 65536 for i in range(128)}},
         "spec.taskTypes[py].annotations", "Kubernetes allows at most 262144"),
        ({"labels": {"bad key!": "x"}}, "spec.taskTypes[py].labels[bad key!]", "qualified name"),
        ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
         "spec.taskTypes[py].volumeMounts[0].name", "do not declare"),
        ({"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
         "spec.taskTypes[py].env[0].valueFrom", "non-empty value"),
        ({"imagePullPolicy": "Sometimes"}, "spec.taskTypes[py].imagePullPolicy", "must be one of"),
        ({"initContainers": [{"name": "task", "image": "x"}]},
         "spec.taskTypes[py].initContainers[0].name", "task's own container"),
        ({"volumes": [{"name": "v", "nfs": {"server": "s", "path": "/"}}]},
         "spec.taskTypes[py].volumes[0].nfs", "unknown field"),
        ({"volumes": [{"name": VOLUME_NAME, "emptyDir": {}}]},
         "spec.taskTypes[py].volumes[0].name", "the run's files' volume"),
        ({"volumes": [{"name": "v", "emptyDir": {}}],
          "volumeMounts": [{"name": "v", "mountPath": "/etc/flowforge/"}]},
         "spec.taskTypes[py].volumeMounts[0].mountPath", "mount elsewhere"),
        ({"volumes": [{"name": "v", "emptyDir": {}}],
          "volumeMounts": [{"name": "v", "mountPath": "/etc//flowforge/./x"}]},
         "spec.taskTypes[py].volumeMounts[0].mountPath", "mount elsewhere"),
    ],
)  # fmt: skip
def test_the_schema_refuses_what_the_apiserver_would(
    template: dict[str, Any], path: str, words: str
) -> None:
    found = errors_of(template)
    assert [p for p, _ in found] == [path], found
    assert words in found[0][1]


SECRET_PARAMETER = {
    "name": "FLOWFORGE_PARAM_TOKEN",
    "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}},
}


@pytest.mark.parametrize(
    ("template", "path"),
    [
        ({"env": [{"name": "A", "value": "1"}, SECRET_PARAMETER]},
         "spec.taskTypes[py].env[1].name"),
        ({"env": [{"name": "FLOWFORGE_PARAM_DATE", "value": "2026-01-01"}]},
         "spec.taskTypes[py].env[0].name"),
        ({"envFrom": [{"secretRef": {"name": "api"}, "prefix": "FLOWFORGE_PARAM_"}]},
         "spec.taskTypes[py].envFrom[0].prefix"),
    ],
)  # fmt: skip
def test_a_template_env_named_like_a_run_parameter_is_refused(
    template: dict[str, Any], path: str
) -> None:
    # else a run's parameter ``token`` would replace the secret's value in the Job
    found = errors_of(template)

    assert [p for p, _ in found] == [path], found
    assert "FLOWFORGE_PARAM_* is where a run's parameters go; rename it" in found[0][1]
    with pytest.raises(InvalidDefinitionError, match="FLOWFORGE_PARAM_"):
        parse_definition(spec_with(template))  # also on load: a published one stops running


def test_names_that_no_parameter_can_take_stay_allowed() -> None:
    allowed = {
        "env": [{"name": "FLOWFORGE_PARAMS", "value": "1"}, {"name": "MY_FLOWFORGE_PARAM_X"}],
        "envFrom": [{"secretRef": {"name": "api"}, "prefix": "API_"}],
        "initContainers": [{"name": "proxy", "image": "envoy:1", "env": [SECRET_PARAMETER]}],
    }
    job = job_of(allowed, parameters={"token": "from-the-run", "params": "x"})
    pod = job["spec"]["template"]["spec"]

    assert errors_of(allowed) == []
    env = {entry["name"]: entry for entry in pod["containers"][0]["env"]}
    assert env["FLOWFORGE_PARAMS"] == {"name": "FLOWFORGE_PARAMS", "value": "1"}
    assert env["FLOWFORGE_PARAM_TOKEN"] == {
        "name": "FLOWFORGE_PARAM_TOKEN",
        "value": "from-the-run",
    }
    # an init container gets no parameters: its env is the template's own
    assert pod["initContainers"][0]["env"] == [SECRET_PARAMETER]


def violations(template: dict[str, Any], **policy: Any) -> list[str]:
    spec = parse_definition(spec_with(template))
    policies = [Policy(namespace="team-a", name="p", spec=PolicySpec.model_validate(policy))]
    return [str(v) for v in definition_violations(spec, policies)]


@pytest.mark.parametrize(
    ("template", "allowing", "path"),
    [
        ({"securityContext": {"privileged": True}}, {"privileged": True},
         "securityContext.privileged"),
        ({"securityContext": {"allowPrivilegeEscalation": True}},
         {"allowPrivilegeEscalation": True}, "securityContext.allowPrivilegeEscalation"),
        ({"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}},
         {"capabilities": ["NET_ADMIN"]}, "securityContext.capabilities.add[0]"),
        ({"hostPID": True}, {"hostNamespaces": True}, "hostPID"),
        ({"volumes": [{"name": "logs", "hostPath": {"path": "/var/log/app"}}]},
         {"hostPaths": ["/var/log"]}, "volumes[0].hostPath"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, {"runAsRoot": True},
         "podSecurityContext.runAsNonRoot"),
        ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, {"unconfined": True},
         "securityContext.seccompProfile.type"),
        ({"podSecurityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1"}]}},
         {"sysctls": ["net.core.*"]}, "podSecurityContext.sysctls[0]"),
        ({"runtimeClassName": "gvisor"}, {"runtimeClasses": ["runc"]}, None),
        ({"initContainers": [{"name": "s", "image": "x", "securityContext": {"privileged": True}}]},
         {"privileged": True}, "initContainers[0].securityContext.privileged"),
    ],
)  # fmt: skip
def test_the_policy_refuses_each_loosening_unless_it_allows_it(
    template: dict[str, Any], allowing: dict[str, Any], path: str | None
) -> None:
    if path is None:  # a list that allows only others
        assert violations(template, podSecurity=allowing) == [
            "spec.taskTypes.py.runtimeClassName: runtimeClassName 'gvisor' is not allowed by "
            "policy team-a/p"
        ]
        return
    refused = violations(template)
    assert len(refused) == 1 and refused[0].startswith(f"spec.taskTypes.py.{path}: "), refused
    assert violations(template, podSecurity=allowing) == []


def test_a_host_path_outside_the_allowed_directories_is_refused() -> None:
    template = {"volumes": [{"name": "etc", "hostPath": {"path": "/var/log/../../etc"}}]}
    assert violations(template, podSecurity={"hostPaths": ["/var/log"]}) == [
        "spec.taskTypes.py.volumes[0].hostPath: host path /var/log/../../etc is not allowed by "
        "policy team-a/p"
    ]


def test_a_required_node_affinity_is_held_to_the_node_selector_policy() -> None:
    term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
    required = {"nodeSelectorTerms": [term]}
    node = {"requiredDuringSchedulingIgnoredDuringExecution": required}
    template = {"affinity": {"nodeAffinity": node}}
    assert violations(template, nodeSelector={"pool": ["gpu", "cpu"]}) == []
    refused = violations(template, nodeSelector={"pool": ["cpu"]})
    assert len(refused) == 1 and "'gpu' of node label 'pool' is not allowed" in refused[0]
    assert "node label 'pool' is not allowed" in violations(template)[0]


def test_job_fields_map_back_to_the_template() -> None:
    template = {"env": [{"name": "A"}, {"name": "FLOWFORGE_RUN"}, {"name": "B"}]}
    request = JobRequest(namespace="n", run_name="r", run_uid="u", task_key="a", attempt=1,
                         role=TaskRole.FORWARD, template=template)  # fmt: skip
    positions = template_env_positions(request)
    assert positions == [0, 2]  # FlowForge's own FLOWFORGE_RUN replaces the template's

    def mapped(field: str, kind: str = "Job") -> str | None:
        return template_path(field, kind=kind, template_path="T", env_positions=positions)

    assert mapped("spec.template.spec.containers[0].env[1].name") == "T.env[2].name"
    assert mapped("spec.template.spec.containers[0].env[5].value") is None
    assert mapped("spec.template.spec.securityContext.runAsUser") == (
        "T.podSecurityContext.runAsUser"
    )
    assert mapped("spec.template.spec.volumes[0].secret.secretName") == (
        "T.volumes[0].secret.secretName"
    )
    assert mapped("metadata.labels") == "T.jobMetadata.labels"
    assert mapped("spec.template.metadata.annotations") == "T.annotations"
    assert mapped("spec.initContainers[0].image", "Pod") == "T.initContainers[0].image"
    assert mapped("spec.backoffLimit") is None
