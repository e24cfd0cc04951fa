"""The chart's fence around the webhook: the apiserver's client CA and the NetworkPolicy."""

from __future__ import annotations

from typing import Any

from flowforge.admission.certs import generate_client_certificates
from tests.cluster.test_helm_chart import Helm, Manifest, _one, helm

__all__ = ["helm"]  # the module-scoped fixture, shared with the chart's other tests

CLIENT_CA_PATH = "/etc/flowforge/webhook-client-ca/ca.crt"


def webhook_pod(manifests: list[Manifest]) -> dict[str, Any]:
    deployment = next(
        m
        for m in manifests
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-webhook")
    )
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def test_by_default_client_certificates_are_not_checked_but_the_port_is_fenced(
    helm: Helm,
) -> None:
    manifests = helm.template({})
    pod = webhook_pod(manifests)
    assert "--client-ca=none" in pod["containers"][0]["command"]
    assert not [m for m in manifests if m["kind"] == "ConfigMap"]
    policy = _one(manifests, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]


def test_a_client_ca_makes_the_webhook_require_the_apiservers_certificate(
    helm: Helm, tmp_path: Any
) -> None:
    ca_pem = generate_client_certificates(tmp_path).ca_cert_path.read_text()
    manifests = helm.template(
        {
            "webhook": {
                "clientAuth": {"caCert": ca_pem},
                "networkPolicy": {"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"]},
            }
        }
    )
    config_map = _one(manifests, "ConfigMap")
    assert config_map["data"]["ca.crt"].strip() == ca_pem.strip()
    pod = webhook_pod(manifests)
    assert f"--client-ca={CLIENT_CA_PATH}" in pod["containers"][0]["command"]
    volume = next(v for v in pod["volumes"] if v["name"] == "client-ca")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["client-ca"]["readOnly"] is True
    (rule,) = _one(manifests, "NetworkPolicy")["spec"]["ingress"]
    blocks = [peer["ipBlock"] for peer in rule["from"]]
    assert blocks == [
        {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]},
        {"cidr": "::/0", "except": ["fd00:10:244::/56"]},
    ]


def test_an_existing_config_map_is_used_as_is(helm: Helm) -> None:
    manifests = helm.template(
        {
            "webhook": {
                "clientAuth": {"existingConfigMap": "apiserver-webhook-client-ca"},
                "networkPolicy": {"enabled": False},
            }
        }
    )
    assert not [m for m in manifests if m["kind"] in ("ConfigMap", "NetworkPolicy")]
    volume = next(v for v in webhook_pod(manifests)["volumes"] if v["name"] == "client-ca")
    assert volume["configMap"]["name"] == "apiserver-webhook-client-ca"
