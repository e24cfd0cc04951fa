"""The Validating/MutatingWebhookConfiguration objects for FlowForge's admission webhooks.

We write these ourselves instead of letting kopf manage them (`settings.admission.managed`),
so that a crashed replica never leaves stale entries behind and RBAC stays minimal.
Each webhook calls exactly one kopf handler: the handler id is the last URL path segment.

Rules cover only our own resources, so a broken webhook server can never block anything
else in the cluster; `failurePolicy: Fail` because an unchecked definition is worse than a
refused one; `sideEffects: None` because admission only reads (the operator publishes
definitions from its watch of stored objects).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from flowforge.domain.api import DEFINITION_PLURAL, GROUP, RUN_PLURAL, VERSION

VALIDATE_DEFINITION_HANDLER_ID = "validate-workflowdefinition"
VALIDATE_RUN_HANDLER_ID = "validate-workflowrun"
MUTATE_RUN_HANDLER_ID = "mutate-workflowrun"
VALIDATE_SCHEDULE_HANDLER_ID = "validate-workflowschedule"
MUTATE_SCHEDULE_HANDLER_ID = "mutate-workflowschedule"
SCHEDULE_PLURAL = "workflowschedules"  # flowforge.domain.schedule.PLURAL
VALIDATE_ACTION_HANDLER_ID = "validate-workflowrunaction"
MUTATE_ACTION_HANDLER_ID = "mutate-workflowrunaction"
ACTION_PLURAL = "workflowrunactions"  # flowforge.domain.run_actions.PLURAL

# what an admission rule may name (the apiserver's, and kopf's ``reviews.Operation``)
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]

CONFIGURATION_NAME = "flowforge-admission"
TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class AdmissionHandlerSpec:
    """One webhook entry: which handler, for which resource and operations."""

    handler_id: str
    plural: str
    operations: tuple[Operation, ...]
    webhook_name: str


VALIDATING_HANDLERS = (
    AdmissionHandlerSpec(
        handler_id=VALIDATE_DEFINITION_HANDLER_ID,
        plural=DEFINITION_PLURAL,
        operations=("CREATE", "UPDATE"),
        webhook_name=f"{DEFINITION_PLURAL}.validate.{GROUP}",
    ),
    AdmissionHandlerSpec(
        handler_id=VALIDATE_RUN_HANDLER_ID,
        plural=RUN_PLURAL,
        operations=("CREATE", "UPDATE"),
        webhook_name=f"{RUN_PLURAL}.validate.{GROUP}",
    ),
    AdmissionHandlerSpec(
        handler_id=VALIDATE_SCHEDULE_HANDLER_ID,
        plural=SCHEDULE_PLURAL,
        operations=("CREATE", "UPDATE"),
        webhook_name=f"{SCHEDULE_PLURAL}.validate.{GROUP}",
    ),
    AdmissionHandlerSpec(
        handler_id=VALIDATE_ACTION_HANDLER_ID,
        plural=ACTION_PLURAL,
        operations=("CREATE", "UPDATE"),
        webhook_name=f"{ACTION_PLURAL}.validate.{GROUP}",
    ),
)
MUTATING_HANDLERS = (
    AdmissionHandlerSpec(
        handler_id=MUTATE_RUN_HANDLER_ID,
        plural=RUN_PLURAL,
        operations=("CREATE",),
        webhook_name=f"{RUN_PLURAL}.mutate.{GROUP}",
    ),
    AdmissionHandlerSpec(
        handler_id=MUTATE_SCHEDULE_HANDLER_ID,
        plural=SCHEDULE_PLURAL,
        operations=("CREATE", "UPDATE"),
        webhook_name=f"{SCHEDULE_PLURAL}.mutate.{GROUP}",
    ),
    AdmissionHandlerSpec(
        handler_id=MUTATE_ACTION_HANDLER_ID,
        plural=ACTION_PLURAL,
        operations=("CREATE",),
        webhook_name=f"{ACTION_PLURAL}.mutate.{GROUP}",
    ),
)


@dataclass(frozen=True)
class WebhookEndpoint:
    """Where the apiserver reaches the webhook server: a URL base or a Service, plus the CA."""

    ca_pem: bytes
    url_base: str | None = None
    service_namespace: str | None = None
    service_name: str | None = None
    service_port: int = 443

    def client_config(self, handler_id: str) -> dict[str, Any]:
        config: dict[str, Any] = {"caBundle": base64.b64encode(self.ca_pem).decode("ascii")}
        if self.url_base is not None:
            config["url"] = f"{self.url_base.rstrip('/')}/{handler_id}"
        else:
            config["service"] = {
                "namespace": self.service_namespace,
                "name": self.service_name,
                "port": self.service_port,
                "path": f"/{handler_id}",
            }
        return config


def local_endpoint(*, port: int, ca_pem: bytes, host: str = "127.0.0.1") -> WebhookEndpoint:
    """The webhook server runs on this machine (tests, `make dev`)."""
    return WebhookEndpoint(ca_pem=ca_pem, url_base=f"https://{host}:{port}")


def in_cluster_endpoint(
    *, namespace: str, service_name: str, ca_pem: bytes, port: int = 443
) -> WebhookEndpoint:
    """The webhook server runs in the cluster behind a Service (the Helm chart)."""
    return WebhookEndpoint(
        ca_pem=ca_pem,
        service_namespace=namespace,
        service_name=service_name,
        service_port=port,
    )


def _webhook(handler: AdmissionHandlerSpec, endpoint: WebhookEndpoint) -> dict[str, Any]:
    return {
        "name": handler.webhook_name,
        "clientConfig": endpoint.client_config(handler.handler_id),
        "rules": [
            {
                "apiGroups": [GROUP],
                "apiVersions": [VERSION],
                "resources": [handler.plural],
                "operations": list(handler.operations),
                "scope": "Namespaced",
            }
        ],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "admissionReviewVersions": ["v1"],
    }


def build_validating_configuration(
    endpoint: WebhookEndpoint, *, name: str = CONFIGURATION_NAME
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "flowforge"}},
        "webhooks": [_webhook(handler, endpoint) for handler in VALIDATING_HANDLERS],
    }


def build_mutating_configuration(
    endpoint: WebhookEndpoint, *, name: str = CONFIGURATION_NAME
) -> dict[str, Any]:
    webhooks = [_webhook(handler, endpoint) for handler in MUTATING_HANDLERS]
    for webhook in webhooks:
        # Our patch only adds spec.version; no other webhook's change can affect that.
        webhook["reinvocationPolicy"] = "Never"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "flowforge"}},
        "webhooks": webhooks,
    }


def _api_client(kubeconfig: Path | None) -> client.ApiClient:
    config_file = str(kubeconfig) if kubeconfig is not None else None
    api_client: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=config_file
    )
    return api_client


def apply_webhook_configurations(
    endpoint: WebhookEndpoint, *, kubeconfig: Path | None = None, name: str = CONFIGURATION_NAME
) -> None:
    """Create or replace both configurations in the cluster the kubeconfig points at."""
    with _api_client(kubeconfig) as api_client:
        # Typed as Any: the client accepts our plain dicts as bodies.
        api: Any = client.AdmissionregistrationV1Api(api_client)
        _create_or_replace(
            api,
            "validating_webhook_configuration",
            build_validating_configuration(endpoint, name=name),
        )
        _create_or_replace(
            api, "mutating_webhook_configuration", build_mutating_configuration(endpoint, name=name)
        )


def _create_or_replace(api: Any, kind: str, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    try:
        getattr(api, f"create_{kind}")(body=body)
    except ApiException as error:
        if error.status != 409:
            raise
        current = getattr(api, f"read_{kind}")(name=name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        getattr(api, f"replace_{kind}")(name=name, body=body)


def delete_webhook_configurations(
    *, kubeconfig: Path | None = None, name: str = CONFIGURATION_NAME
) -> None:
    """Remove both configurations; absent ones are fine."""
    with _api_client(kubeconfig) as api_client:
        # Typed as Any: the client accepts our plain dicts as bodies.
        api: Any = client.AdmissionregistrationV1Api(api_client)
        for delete in (
            api.delete_validating_webhook_configuration,
            api.delete_mutating_webhook_configuration,
        ):
            try:
                delete(name=name)
            except ApiException as error:
                if error.status != 404:
                    raise
