"""The Helm chart against the real helm binary and the real kube-apiserver.

- lint/template for every option, and the schema refusing bad values with the value's path;
- the rendered webhook configurations equal what the operator's own builder produces, and
  the generated certificate is signed by the CA in caBundle;
- install, upgrade (the generated certificate is kept) and uninstall (no cluster-scoped
  leftovers but the CRDs) on the local control plane;
- RBAC proven by `kubectl auth can-i` for the chart's ServiceAccounts, and by the operator
  itself running a diamond with a token of the chart's ServiceAccount and nothing else.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from flowforge.kube.webhook_config import (
    build_mutating_configuration,
    build_validating_configuration,
    in_cluster_endpoint,
)
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.connection import Pool
from tests.plugins.helm import CHART, KUBE_VERSION, RELEASE_NAMESPACE, Helm, Manifest, one_manifest
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.plugins.webhooks import (
    WebhookHttps,
    WebhookServer,
    spawn_webhook_server,
    stop_webhook_server,
)
from tests.support.admission import ADMIN, admission_review, wrap
from tests.support.waiting import wait_until_blocking

OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "cert-manager-cluster-issuer": {
        "webhook": {
            "certManager": {
                "enabled": True,
                "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
            }
        }
    },
    "bundled-postgresql": {"database": {"existingSecret": "", "bundled": {"enabled": True}}},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "single-replicas": {"operator": {"replicas": 1}, "webhook": {"replicas": 1}},
    "no-webhook": {"webhook": {"enabled": False}},
}


def _kinds(manifests: list[Manifest]) -> set[str]:
    return {m["kind"] for m in manifests}


def _pod_specs(manifests: list[Manifest]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (m["metadata"]["name"], m["spec"]["template"]["spec"])
        for m in manifests
        if m["kind"] in ("Deployment", "StatefulSet")
    ]


# Rendering


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_lint_and_template_pass_for_each_option(helm: Helm, option: str) -> None:
    values_file = helm.values_file(OPTIONS[option])
    lint = helm.run(
        "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, "-f", str(values_file)
    )
    assert "0 chart(s) failed" in lint.stdout
    manifests = helm.template(OPTIONS[option])
    kinds = _kinds(manifests)
    assert {"Deployment", "ServiceAccount", "Service"} <= kinds
    webhook = option != "no-webhook"
    assert ("ValidatingWebhookConfiguration" in kinds) is webhook
    assert ("MutatingWebhookConfiguration" in kinds) is webhook
    assert ("Certificate" in kinds) is option.startswith("cert-manager")
    issuers = {m["metadata"]["name"] for m in manifests if m["kind"] == "Issuer"}
    # the serving certificate's own self-signed Issuer, unless one is named
    assert ("ff-flowforge-selfsigned" in issuers) is (option == "cert-manager")
    # the apiserver's client certificate: its CA chain with cert-manager, else generated
    client_issuers = {"ff-flowforge-webhook-client-root", "ff-flowforge-webhook-client-ca"}
    assert (client_issuers <= issuers) is option.startswith("cert-manager")
    assert ("StatefulSet" in kinds) is (option == "bundled-postgresql")
    assert ("ServiceMonitor" in kinds) is (option == "service-monitor")
    assert ("Role" in kinds) is (option == "namespaced")
    assert ("PodDisruptionBudget" in kinds) is (option != "single-replicas")


def _template_refused(helm: Helm, *assignments: str) -> subprocess.CompletedProcess[str]:
    settings = [part for assignment in assignments for part in ("--set", assignment)]
    completed = helm.run(
        "template", "ff", str(CHART), "--kube-version", KUBE_VERSION, *settings, check=False
    )
    assert completed.returncode != 0
    return completed


@pytest.mark.parametrize(
    ("assignment", "complaint"),
    [
        ("operator.replicas=0", "at '/operator/replicas': minimum"),
        ("webhook.timeoutSeconds=45", "at '/webhook/timeoutSeconds': maximum"),
        ("database.existingSecret=", "at '/database/existingSecret'"),
        ("operator.logging.format=xml", "at '/operator/logging/format'"),
        ("watchNamespaces={Team_A}", "at '/watchNamespaces/0'"),
        ("operator.replicaCount=2", "additional properties 'replicaCount' not allowed"),
        (
            "containerSecurityContext.allowPrivilegeEscalation=true",
            "at '/containerSecurityContext/allowPrivilegeEscalation'",
        ),
        ("metrics.port=80", "at '/metrics/port': minimum"),
        ("webhook.clientAuth.caFile=x", "additional properties 'caFile' not allowed"),
        ("webhook.networkPolicy.enabled=maybe", "at '/webhook/networkPolicy/enabled'"),
        ("image.digest=sha256:abc", "at '/image/digest'"),
        ("webhook.certManager.issuerRef.kind=Vault", "at '/webhook/certManager/issuerRef/kind'"),
        ("migrations.mode=job", "at '/migrations/mode'"),
        ("database.components.retention.existingSecret=x", "additional properties 'retention'"),
    ],
)
def test_schema_refuses_bad_values_naming_the_value(
    helm: Helm, assignment: str, complaint: str
) -> None:
    completed = _template_refused(helm, assignment)
    assert completed.returncode != 0
    assert "values don't meet the specifications of the schema" in completed.stderr
    assert complaint in completed.stderr, completed.stderr


def _serving_secret(manifests: list[Manifest]) -> Manifest:
    (secret,) = [
        m
        for m in manifests
        if m["kind"] == "Secret" and m["metadata"]["name"] == "ff-flowforge-webhook-tls"
    ]
    return secret


def test_rendered_webhooks_are_the_operators_own_configuration(helm: Helm) -> None:
    manifests = helm.template({})
    secret = _serving_secret(manifests)
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    endpoint = in_cluster_endpoint(
        namespace=RELEASE_NAMESPACE, service_name="ff-flowforge-webhook", ca_pem=ca_pem
    )
    validating = one_manifest(manifests, "ValidatingWebhookConfiguration")
    mutating = one_manifest(manifests, "MutatingWebhookConfiguration")
    assert validating["webhooks"] == build_validating_configuration(endpoint)["webhooks"]
    assert mutating["webhooks"] == build_mutating_configuration(endpoint)["webhooks"]
    service = next(
        m
        for m in manifests
        if m["kind"] == "Service" and m["metadata"]["name"] == "ff-flowforge-webhook"
    )
    assert service["spec"]["ports"][0]["port"] == 443


def test_generated_certificate_is_signed_by_the_ca_bundle_for_the_service(helm: Helm) -> None:
    secret = _serving_secret(helm.template({}))
    assert secret["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "ff-flowforge-webhook.flowforge-system.svc" in names.get_values_for_type(x509.DNSName)


def test_cert_manager_injects_the_ca_instead_of_a_generated_secret(helm: Helm) -> None:
    manifests = helm.template(OPTIONS["cert-manager"])
    assert "Secret" not in _kinds(manifests)
    (certificate,) = [
        m
        for m in manifests
        if m["kind"] == "Certificate" and m["metadata"]["name"] == "ff-flowforge-webhook"
    ]
    assert certificate["spec"]["secretName"] == "ff-flowforge-webhook-tls"
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        configuration = one_manifest(manifests, kind)
        assert configuration["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": "flowforge-system/ff-flowforge-webhook"
        }
        assert all("caBundle" not in hook["clientConfig"] for hook in configuration["webhooks"])


def test_namespaced_mode_grants_roles_in_the_watched_namespaces_only(helm: Helm) -> None:
    manifests = helm.template(OPTIONS["namespaced"])
    roles = [m for m in manifests if m["kind"] == "Role"]
    operator_roles = [r for r in roles if r["metadata"]["name"].endswith("-operator")]
    assert sorted(r["metadata"]["namespace"] for r in operator_roles) == ["team-a", "team-b"]
    webhook_roles = [r for r in roles if r["metadata"]["name"].endswith("-webhook-read")]
    assert sorted(r["metadata"]["namespace"] for r in webhook_roles) == ["team-a", "team-b"]
    # the webhook reads definitions (runs applied with theirs) and policies, and writes
    # nothing: it creates Jobs and Pods only as dry-runs of the task types
    for role in webhook_roles:
        assert role["rules"] == [
            {
                "apiGroups": ["flowforge.io"],
                "resources": ["workflowdefinitions", "flowforgepolicies"],
                "verbs": ["list"],
            },
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
        ]
    assert len(roles) == len(operator_roles) + len(webhook_roles)
    cluster_roles = {
        "-".join(m["metadata"]["name"].split("-")[-2:]): m["rules"]
        for m in manifests
        if m["kind"] == "ClusterRole"
    }
    # FlowForge's own accounts hold three cluster-wide rights: kopf's read-only CRD watch,
    # the webhook's SubjectAccessReviews, and the read API server's reviews of its callers;
    # the tenant roles (the recoverer's custom verbs on runs among them) are for admins to bind
    assert sorted(cluster_roles) == [
        "crd-watch", "operator-namespaces", "server-review", "serviceaccount-user",
        "webhook-review", "workflow-editor", "workflow-recoverer", "workflow-viewer",
    ]  # fmt: skip
    assert cluster_roles["server-review"] == [
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        },
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["subjectaccessreviews"],
            "verbs": ["create"],
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]},
    ]
    assert cluster_roles["crd-watch"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        }
    ]
    # the operator reads only the watched namespaces (their uids, issue 24)
    assert cluster_roles["operator-namespaces"] == [
        {
            "apiGroups": [""],
            "resources": ["namespaces"],
            "verbs": ["get"],
            "resourceNames": ["team-a", "team-b"],
        }
    ]
    assert cluster_roles["webhook-review"] == [
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["subjectaccessreviews"],
            "verbs": ["create"],
        }
    ]
    bound = sorted(
        "-".join(m["roleRef"]["name"].split("-")[-2:])
        for m in manifests
        if m["kind"] == "ClusterRoleBinding"
    )
    assert bound == ["crd-watch", "operator-namespaces", "server-review", "webhook-review"]
    operator = next(
        m
        for m in manifests
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-operator")
    )
    environment = {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert environment["FLOWFORGE_NAMESPACES"] == "team-a,team-b"
    for hook in one_manifest(manifests, "ValidatingWebhookConfiguration")["webhooks"]:
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a", "team-b"]


@pytest.mark.parametrize("option", ["default", "bundled-postgresql"])
def test_every_pod_is_hardened_probed_and_sized(helm: Helm, option: str) -> None:
    for name, pod in _pod_specs(helm.template(OPTIONS[option])):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, (name, container["name"])
            assert context["readOnlyRootFilesystem"] is True, (name, container["name"])
            assert context["capabilities"] == {"drop": ["ALL"]}, (name, container["name"])
            assert container["resources"]["requests"], (name, container["name"])
        for container in pod["containers"]:
            assert {"livenessProbe", "readinessProbe"} <= set(container), name


def test_pods_migrate_the_store_before_starting(helm: Helm) -> None:
    pods = dict(_pod_specs(helm.template({})))
    for name in ("ff-flowforge-operator", "ff-flowforge-webhook"):
        (init,) = pods[name]["initContainers"]
        assert init["command"][:3] == ["flowforge", "db", "migrate"]
        assert init["env"][0]["valueFrom"]["secretKeyRef"] == {
            "name": "flowforge-database",
            "key": "dsn",
        }


def _dsn_secret(container: dict[str, Any]) -> dict[str, Any]:
    (dsn,) = [env for env in container["env"] if env["name"] == "FLOWFORGE_DSN"]
    reference: dict[str, Any] = dsn["valueFrom"]["secretKeyRef"]
    return reference


def test_each_component_reads_its_own_dsn_and_a_hook_job_migrates_as_the_migrator(
    helm: Helm,
) -> None:
    manifests = helm.template(
        {
            "migrations": {"mode": "hook", "lockTimeoutSeconds": 7},
            "database": {
                "components": {
                    "migrator": {"existingSecret": "ff-migrator", "secretKey": "url"},
                    "operator": {"existingSecret": "ff-operator"},
                    "webhook": {"existingSecret": "ff-webhook"},
                }
            },
        }
    )
    pods = dict(_pod_specs(manifests))
    (job,) = [m for m in manifests if m["kind"] == "Job"]
    (migrate,) = job["spec"]["template"]["spec"]["containers"]

    for name, secret in (
        ("ff-flowforge-operator", "ff-operator"),
        ("ff-flowforge-webhook", "ff-webhook"),
    ):
        assert "initContainers" not in pods[name], name
        (main,) = pods[name]["containers"]
        assert _dsn_secret(main) == {"name": secret, "key": "dsn"}
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert migrate["command"] == ["flowforge", "db", "migrate", "--lock-timeout", "7s"]
    assert _dsn_secret(migrate) == {"name": "ff-migrator", "key": "url"}
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_init_containers_migrate_as_the_migrator_when_it_has_its_own_secret(helm: Helm) -> None:
    pods = dict(
        _pod_specs(
            helm.template(
                {"database": {"components": {"migrator": {"existingSecret": "ff-migrator"}}}}
            )
        )
    )
    for name in ("ff-flowforge-operator", "ff-flowforge-webhook"):
        (init,) = pods[name]["initContainers"]
        (main,) = pods[name]["containers"]
        assert _dsn_secret(init) == {"name": "ff-migrator", "key": "dsn"}
        assert _dsn_secret(main) == {"name": "flowforge-database", "key": "dsn"}


def test_a_migration_hook_refuses_the_bundled_database(helm: Helm) -> None:
    completed = _template_refused(helm, "migrations.mode=hook", "database.bundled.enabled=true")
    assert "migrations.mode=hook needs an existing database" in completed.stderr


# On the apiserver


def _kubectl_lines(cluster: Cluster, *args: str) -> list[str]:
    return [line for line in kubectl(cluster, *args).stdout.splitlines() if line]


def _can(
    cluster: Cluster, service_account: str, verb: str, resource: str, namespace: str | None
) -> bool:
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    resource, _, subresource = resource.partition("/")
    if subresource:
        scope.append(f"--subresource={subresource}")
    completed = kubectl(
        cluster, "auth", "can-i", verb, resource, *scope, f"--as={service_account}", check=False
    )
    answer = completed.stdout.strip()
    assert answer in ("yes", "no"), completed.stderr
    return answer == "yes"


@pytest.fixture
def release_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"ffh-{uuid.uuid4().hex[:8]}"
    kubectl(cluster, "create", "namespace", name)
    yield name
    kubectl(cluster, "delete", "namespace", name, "--wait=false", check=False)


def _manifest_objects_exist(
    helm: Helm, cluster: Cluster, release: str, namespace: str, tmp_path: Path
) -> int:
    manifest = helm.run(
        "get", "manifest", release, "-n", namespace, kubeconfig=cluster.kubeconfig
    ).stdout
    path = tmp_path / f"{release}-manifest.yaml"
    path.write_text(manifest)
    expected = [doc for doc in yaml.safe_load_all(manifest) if doc]
    found = json.loads(kubectl(cluster, "get", "-f", str(path), "-o", "json").stdout)
    items = found.get("items", [found])
    assert [(i["kind"], i["metadata"]["name"]) for i in items] == [
        (d["kind"], d["metadata"]["name"]) for d in expected
    ]
    return len(items)


CLUSTER_SCOPED = (
    "clusterroles,clusterrolebindings,validatingwebhookconfigurations,mutatingwebhookconfigurations"
)


@pytest.mark.cluster
def test_install_upgrade_keeps_certificate_uninstall_leaves_only_crds(
    helm: Helm, cluster: Cluster, release_namespace: str, tmp_path: Path
) -> None:
    release = f"ff{uuid.uuid4().hex[:6]}"
    values = helm.values_file({"database": {"bundled": {"enabled": True}}})
    helm.run(
        "install",
        release,
        str(CHART),
        "-n",
        release_namespace,
        "-f",
        str(values),
        kubeconfig=cluster.kubeconfig,
    )
    try:
        count = _manifest_objects_exist(helm, cluster, release, release_namespace, tmp_path)
        assert count >= 18
        secret_name = f"{release}-flowforge-webhook-tls"
        before = json.loads(
            kubectl(
                cluster, "get", "secret", secret_name, "-n", release_namespace, "-o", "json"
            ).stdout
        )["data"]
        client_secret = f"{release}-flowforge-webhook-client"
        client_before = json.loads(
            kubectl(
                cluster, "get", "secret", client_secret, "-n", release_namespace, "-o", "json"
            ).stdout
        )["data"]
        # the owner's password and each component's login (issue 24)
        database_secrets = [
            f"{release}-flowforge-postgresql{suffix}"
            for suffix in ("", "-operator", "-webhook", "-server")
        ]

        def database_passwords() -> list[str]:
            return [
                json.loads(
                    kubectl(
                        cluster, "get", "secret", name, "-n", release_namespace, "-o", "json"
                    ).stdout
                )["data"]["password"]
                for name in database_secrets
            ]

        database_before = database_passwords()
        helm.run(
            "upgrade",
            release,
            str(CHART),
            "-n",
            release_namespace,
            "--reuse-values",
            "--set",
            "operator.replicas=3",
            "--set",
            "operator.reconcileIntervalSeconds=5",
            kubeconfig=cluster.kubeconfig,
        )
        after = json.loads(
            kubectl(
                cluster, "get", "secret", secret_name, "-n", release_namespace, "-o", "json"
            ).stdout
        )["data"]
        assert after == before, "helm upgrade replaced the generated webhook certificate"
        client_after = json.loads(
            kubectl(
                cluster, "get", "secret", client_secret, "-n", release_namespace, "-o", "json"
            ).stdout
        )["data"]
        assert client_after == client_before, "helm upgrade replaced the client certificate"
        assert database_passwords() == database_before, "helm upgrade changed a password"
        assert len(set(database_before)) == 4
        webhook_config = json.loads(
            kubectl(
                cluster,
                "get",
                "validatingwebhookconfiguration",
                f"{release}-flowforge-{release_namespace}",
                "-o",
                "json",
            ).stdout
        )
        assert {hook["clientConfig"]["caBundle"] for hook in webhook_config["webhooks"]} == {
            before["ca.crt"]
        }
        deployment = json.loads(
            kubectl(
                cluster,
                "get",
                "deployment",
                f"{release}-flowforge-operator",
                "-n",
                release_namespace,
                "-o",
                "json",
            ).stdout
        )
        assert deployment["spec"]["replicas"] == 3
        assert _kubectl_lines(
            cluster,
            "get",
            CLUSTER_SCOPED,
            "-o",
            "name",
            "-l",
            f"app.kubernetes.io/instance={release}",
        )
    finally:
        helm.run(
            "uninstall", release, "-n", release_namespace, "--wait", kubeconfig=cluster.kubeconfig
        )
    assert (
        _kubectl_lines(
            cluster,
            "get",
            CLUSTER_SCOPED,
            "-o",
            "name",
            "-l",
            f"app.kubernetes.io/instance={release}",
        )
        == []
    )
    crds = _kubectl_lines(cluster, "get", "crd", "-o", "name")
    assert "customresourcedefinition.apiextensions.k8s.io/workflowruns.flowforge.io" in crds
    assert "customresourcedefinition.apiextensions.k8s.io/workflowdefinitions.flowforge.io" in crds


@pytest.mark.cluster
def test_cluster_wide_rbac_grants_exactly_what_the_operator_calls(
    helm: Helm, cluster: Cluster, release_namespace: str, tmp_path: Path
) -> None:
    release = f"ff{uuid.uuid4().hex[:6]}"
    helm.run("install", release, str(CHART), "-n", release_namespace, kubeconfig=cluster.kubeconfig)
    try:
        operator = f"system:serviceaccount:{release_namespace}:{release}-flowforge-operator"
        webhook = f"system:serviceaccount:{release_namespace}:{release}-flowforge-webhook"
        granted = [
            ("get", "workflowruns.flowforge.io"),
            ("list", "workflowruns.flowforge.io"),
            ("watch", "workflowruns.flowforge.io"),
            ("patch", "workflowruns.flowforge.io"),
            ("patch", "workflowruns.flowforge.io/status"),
            ("update", "workflowruns.flowforge.io/finalizers"),
            # a WorkflowSchedule's runs and its spec.history (issue 28)
            ("create", "workflowruns.flowforge.io"),
            ("delete", "workflowruns.flowforge.io"),
            ("get", "workflowschedules.flowforge.io"),
            ("list", "workflowschedules.flowforge.io"),
            ("watch", "workflowschedules.flowforge.io"),
            ("patch", "workflowschedules.flowforge.io"),
            ("patch", "workflowschedules.flowforge.io/status"),
            ("update", "workflowschedules.flowforge.io/finalizers"),
            ("list", "workflowdefinitions.flowforge.io"),
            ("watch", "workflowdefinitions.flowforge.io"),
            ("create", "jobs.batch"),
            ("delete", "jobs.batch"),
            ("get", "jobs.batch"),
            ("list", "jobs.batch"),
            ("watch", "jobs.batch"),
            ("list", "pods"),
            ("watch", "pods"),
            ("create", "events"),
            ("create", "configmaps"),
            ("get", "configmaps"),
            ("get", "namespaces"),  # its uid, recorded with runs and definitions
        ]
        for verb, resource in granted:
            assert _can(cluster, operator, verb, resource, None), (verb, resource)
            assert _can(cluster, operator, verb, resource, "default"), (verb, resource)
        assert _can(cluster, operator, "watch", "customresourcedefinitions", None)
        assert _can(cluster, webhook, "list", "customresourcedefinitions", None)
        refused = [
            ("get", "secrets", "kube-system"),
            ("list", "secrets", "default"),
            ("list", "configmaps", "default"),
            ("update", "configmaps", "default"),
            ("delete", "configmaps", "default"),
            ("create", "pods", "default"),
            ("delete", "pods", "default"),
            ("update", "workflowruns.flowforge.io", "default"),
            ("delete", "workflowschedules.flowforge.io", "default"),
            ("create", "workflowschedules.flowforge.io", "default"),
            ("create", "workflowdefinitions.flowforge.io", "default"),
            ("update", "jobs.batch", "default"),
            ("create", "leases.coordination.k8s.io", "default"),
            ("delete", "customresourcedefinitions", None),
            ("create", "clusterrolebindings", None),
            ("list", "namespaces", None),
            ("patch", "validatingwebhookconfigurations", None),
        ]
        for verb, resource, namespace in refused:
            assert not _can(cluster, operator, verb, resource, namespace), (verb, resource)
        # Jobs and Pods it creates only as dry-runs of the task types (no verb says that)
        assert _can(cluster, webhook, "create", "jobs.batch", "default")
        assert _can(cluster, webhook, "create", "pods", "default")
        for verb, resource, namespace in [
            ("delete", "jobs.batch", "default"),
            ("delete", "pods", "default"),
            ("list", "workflowruns.flowforge.io", "default"),
            ("get", "secrets", release_namespace),
        ]:
            assert not _can(cluster, webhook, verb, resource, namespace), (verb, resource)
    finally:
        helm.run(
            "uninstall", release, "-n", release_namespace, "--wait", kubeconfig=cluster.kubeconfig
        )


def _token_kubeconfig(
    cluster: Cluster, *, service_account: str, namespace: str, path: Path
) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount itself (a bound token)."""
    token = kubectl(
        cluster, "create", "token", service_account, "-n", namespace, "--duration=1h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster_entry],
                "users": [{"name": service_account, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "chart-sa",
                        "context": {"cluster": cluster_entry["name"], "user": service_account},
                    }
                ],
                "current-context": "chart-sa",
            }
        )
    )
    return path


STEP = {
    "image": "busybox:1.36",
    "command": ["true"],
    "annotations": {"flowforge.io/simulate-duration": "1s"},
}


@contextmanager
def _namespaced_release(
    helm: Helm, cluster: Cluster, *, release_namespace: str, watched_namespace: str
) -> Iterator[str]:
    """The chart installed in namespaced mode for one watched namespace; uninstalled after."""
    release = f"ff{uuid.uuid4().hex[:6]}"
    # the webhook is off here: its pods are kwok's fakes, and nothing may dial them
    values = helm.values_file(
        {"watchNamespaces": [watched_namespace], "webhook": {"enabled": False}}
    )
    helm.run(
        "install",
        release,
        str(CHART),
        "-n",
        release_namespace,
        "-f",
        str(values),
        kubeconfig=cluster.kubeconfig,
    )
    try:
        yield release
    finally:
        helm.run(
            "uninstall", release, "-n", release_namespace, "--wait", kubeconfig=cluster.kubeconfig
        )


async def _start_operator(
    *,
    kubeconfig: Path,
    store_dsn: str,
    engine_store: Pool,
    engine_namespace: str,
    tmp_path: Path,
    extra_env: dict[str, str] | None = None,
) -> OperatorProcess:
    """The operator, run locally with the chart ServiceAccount's credentials, leading."""
    process = OperatorProcess(
        dsn=store_dsn,
        kubeconfig=kubeconfig,
        namespace=engine_namespace,
        identity="chart-sa",
        log_path=tmp_path / "operator.log",
        extra_env=dict(extra_env or {}),
    )
    process.start()
    await wait_for_leader(engine_store, process.identity, process=process)
    return process


@pytest.mark.cluster
async def test_operator_runs_a_diamond_with_only_the_namespaced_chart_rbac(
    helm: Helm,
    cluster: Cluster,
    release_namespace: str,
    engine_namespace: str,
    driver: RunDriver,
    engine_store: Pool,
    store_dsn: str,
    tmp_path: Path,
) -> None:
    process: OperatorProcess | None = None
    with _namespaced_release(
        helm, cluster, release_namespace=release_namespace, watched_namespace=engine_namespace
    ) as release:
        try:
            service_account = f"{release}-flowforge-operator"
            subject = f"system:serviceaccount:{release_namespace}:{service_account}"
            assert _can(cluster, subject, "create", "jobs.batch", engine_namespace)
            assert _can(
                cluster, subject, "patch", "workflowruns.flowforge.io/status", engine_namespace
            )
            for verb, resource, namespace in [
                ("get", "secrets", engine_namespace),
                ("get", "secrets", release_namespace),
                ("create", "jobs.batch", release_namespace),
                ("create", "jobs.batch", "default"),
                ("list", "jobs.batch", None),
                ("list", "workflowruns.flowforge.io", None),
            ]:
                assert not _can(cluster, subject, verb, resource, namespace), (verb, namespace)

            kubeconfig = _token_kubeconfig(
                cluster,
                service_account=service_account,
                namespace=release_namespace,
                path=tmp_path / "chart-sa.kubeconfig",
            )
            forbidden = kubectl(
                cluster,
                "--kubeconfig",
                str(kubeconfig),
                "get",
                "secrets",
                "-n",
                engine_namespace,
                check=False,
            )
            assert forbidden.returncode != 0 and "Forbidden" in forbidden.stderr

            process = await _start_operator(
                kubeconfig=kubeconfig,
                store_dsn=store_dsn,
                engine_store=engine_store,
                engine_namespace=engine_namespace,
                tmp_path=tmp_path,
                extra_env={"FLOWFORGE_JOB_TTL": "1"},
            )
            await driver.publish(
                {
                    "workflow": "diamond",
                    "version": 1,
                    "taskTypes": {"step": STEP},
                    "tasks": [
                        {"key": "extract", "type": "step"},
                        {"key": "left", "type": "step", "dependsOn": ["extract"]},
                        {"key": "right", "type": "step", "dependsOn": ["extract"]},
                        {"key": "load", "type": "step", "dependsOn": ["left", "right"]},
                    ],
                }
            )
            driver.create_run("d1", workflow="diamond")
            body = await driver.wait_phase("d1", {"Succeeded", "Failed"}, operator=process)
            assert body["status"]["phase"] == "Succeeded", body["status"]
            assert body["status"]["progress"] == "4/4"
            assert {"RunStarted", "RunSucceeded"} <= {event.reason for event in driver.events("d1")}
            # finished Jobs are deleted after their TTL: the delete verb works as granted
            wait_until_blocking(
                lambda: not driver.jobs("d1"), timeout=60, what="finished Jobs deleted"
            )
            # The one refusal allowed: kopf's namespace scan (namespaced mode grants no
            # cluster-wide namespace list; kopf then uses the watched namespaces as given).
            refusals = [
                line
                for line in process.log_path.read_text(errors="replace").splitlines()
                if "Forbidden" in line or "403" in line
            ]
            unexpected = [
                line
                for line in refusals
                if "/api/v1/namespaces ->" not in line
                and "permissions to list namespaces" not in line
            ]
            assert unexpected == [], "\n".join(unexpected)
        finally:
            if process is not None:
                process.stop()


FAIL = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-exit-code": "3"}}


def _admin_review(spec: dict[str, Any]) -> bytes:
    """A definition's review as an administrator's: the webhook's account must be able to
    review their access."""
    definition = wrap("WorkflowDefinition", spec, namespace="default")
    return admission_review(definition, dry_run=False, namespace="default", user=ADMIN)


@pytest.mark.cluster
async def test_operator_compensates_with_only_the_namespaced_chart_rbac(
    helm: Helm,
    cluster: Cluster,
    release_namespace: str,
    engine_namespace: str,
    driver: RunDriver,
    engine_store: Pool,
    store_dsn: str,
    tmp_path: Path,
) -> None:
    process: OperatorProcess | None = None
    with _namespaced_release(
        helm, cluster, release_namespace=release_namespace, watched_namespace=engine_namespace
    ) as release:
        try:
            kubeconfig = _token_kubeconfig(
                cluster,
                service_account=f"{release}-flowforge-operator",
                namespace=release_namespace,
                path=tmp_path / "chart-sa.kubeconfig",
            )
            process = await _start_operator(
                kubeconfig=kubeconfig,
                store_dsn=store_dsn,
                engine_store=engine_store,
                engine_namespace=engine_namespace,
                tmp_path=tmp_path,
            )
            await driver.publish(
                {
                    "workflow": "saga",
                    "version": 1,
                    "taskTypes": {"ok": STEP, "fail": FAIL},
                    "tasks": [
                        {"key": "reserve", "type": "ok"},
                        {"key": "charge", "type": "fail", "dependsOn": ["reserve"]},
                        {"key": "release", "type": "ok", "compensateFor": "reserve"},
                    ],
                }
            )
            driver.create_run("s1", workflow="saga")
            body = await driver.wait_phase("s1", {"Succeeded", "Failed"}, operator=process)
            assert body["status"]["phase"] == "Failed", body["status"]
            compensations = [
                job
                for job in driver.jobs("s1")
                if job.metadata.labels["flowforge.io/role"] == "compensation"
            ]
            compensated = [job.metadata.labels["flowforge.io/task"] for job in compensations]
            assert compensated == ["release"]
        finally:
            if process is not None:
                process.stop()


@pytest.mark.cluster
def test_webhook_server_serves_with_only_the_webhook_service_account(
    helm: Helm, cluster: Cluster, release_namespace: str, store_dsn: str, tmp_path: Path
) -> None:
    release = f"ff{uuid.uuid4().hex[:6]}"
    helm.run("install", release, str(CHART), "-n", release_namespace, kubeconfig=cluster.kubeconfig)
    server: WebhookServer | None = None
    try:
        kubeconfig = _token_kubeconfig(
            cluster,
            service_account=f"{release}-flowforge-webhook",
            namespace=release_namespace,
            path=tmp_path / "webhook-sa.kubeconfig",
        )
        # served on 127.0.0.1 with local certificates; the apiserver is not pointed at it
        server = spawn_webhook_server(
            cluster, directory=tmp_path, dsn=store_dsn, kubeconfig=kubeconfig
        )
        https = WebhookHttps(server, client=server.client)
        good = {
            "workflow": "etl",
            "version": 1,
            "taskTypes": {"t": {"image": "busybox"}},
            "tasks": [{"key": "a", "type": "t"}, {"key": "b", "type": "t", "dependsOn": ["a"]}],
        }
        cyclic = {
            **good,
            "tasks": [
                {"key": "a", "type": "t", "dependsOn": ["b"]},
                {"key": "b", "type": "t", "dependsOn": ["a"]},
            ],
        }
        allowed = https.post("validate-workflowdefinition", _admin_review(good))
        assert allowed.status == 200 and allowed.json()["response"]["allowed"] is True, allowed.body
        denied = https.post("validate-workflowdefinition", _admin_review(cyclic))
        response = denied.json()["response"]
        assert response["allowed"] is False and "a -> b -> a" in response["status"]["message"]
        server.assert_alive()
        refusals = [
            line
            for line in server.log_path.read_text(errors="replace").splitlines()
            if "Forbidden" in line or " 403" in line
        ]
        assert refusals == [], "\n".join(refusals)
    finally:
        if server is not None:
            stop_webhook_server(server)
        helm.run(
            "uninstall", release, "-n", release_namespace, "--wait", kubeconfig=cluster.kubeconfig
        )
