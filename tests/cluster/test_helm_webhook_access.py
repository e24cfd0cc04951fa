"""The chart's fence around the webhook: the apiserver's client CA and the NetworkPolicy."""

from __future__ import annotations

import base64
import contextlib
import ssl
from pathlib import Path
from typing import Any

import pytest

from flowforge.admission.certs import WebhookCertificates, generate_client_certificates
from flowforge.admission.transport import GuardedWebhookServer
from tests.plugins.helm import CHART, KUBE_VERSION, Helm, Manifest, one_manifest

CLIENT_CA_PATH = "/etc/flowforge/webhook-client-ca/ca.crt"


def webhook_pod(manifests: list[Manifest]) -> dict[str, Any]:
    deployment = next(
        m
        for m in manifests
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-webhook")
    )
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def _named(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    (found,) = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, *, hostname: str) -> None:
    """A whole TLS handshake in memory; raises ssl.SSLError when either side refuses."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    client_end = client.wrap_bio(to_client, to_server, server_hostname=hostname)
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, end in (("client", client_end), ("server", server_end)):
            if done[name]:
                continue
            try:
                end.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
        if all(done.values()):
            # TLS 1.3: the server judges the client certificate after the client is done;
            # one read on each side lets a refusal reach the client as an alert
            with contextlib.suppress(ssl.SSLWantReadError):
                server_end.read(1)
            with contextlib.suppress(ssl.SSLWantReadError):
                client_end.read(1)
            return
    raise AssertionError("the handshake did not finish")


def test_by_default_the_webhook_checks_client_certificates_of_a_ca_the_chart_made(
    helm: Helm, tmp_path: Path
) -> None:
    manifests = helm.template({})
    pod = webhook_pod(manifests)
    command = pod["containers"][0]["command"]
    assert f"--client-ca={CLIENT_CA_PATH}" in command
    assert "--client-ca=none" not in command
    volume = next(v for v in pod["volumes"] if v["name"] == "client-ca")
    config_map = _named(manifests, "ConfigMap", volume["configMap"]["name"])
    client = _named(manifests, "Secret", "ff-flowforge-webhook-client")
    serving = _named(manifests, "Secret", "ff-flowforge-webhook-tls")
    client_ca = base64.b64decode(client["data"]["ca.crt"])
    assert config_map["data"]["ca.crt"].strip() == client_ca.decode().strip()
    # the client CA is its own: the webhook does not trust its serving CA for clients
    assert client_ca != base64.b64decode(serving["data"]["ca.crt"])
    # the certificate the apiserver is to present gets past the real server's handshake;
    # none, or one of the serving CA, does not
    for secret, prefix in ((serving, "serving-"), (client, "client-")):
        for key in ("ca.crt", "tls.crt", "tls.key"):
            (tmp_path / f"{prefix}{key}").write_bytes(base64.b64decode(secret["data"][key]))
    (tmp_path / "client-ca.crt").write_text(config_map["data"]["ca.crt"])
    server = GuardedWebhookServer(
        addr="127.0.0.1",
        port=0,
        certs=WebhookCertificates(
            ca_cert_path=tmp_path / "serving-ca.crt",
            cert_path=tmp_path / "serving-tls.crt",
            key_path=tmp_path / "serving-tls.key",
        ),
        client_ca=tmp_path / "client-ca.crt",
    ).ssl_context()
    hostname = "ff-flowforge-webhook.flowforge-system.svc"

    def client_context(prefix: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(tmp_path / "serving-ca.crt"))
        if prefix is not None:
            context.load_cert_chain(tmp_path / f"{prefix}tls.crt", tmp_path / f"{prefix}tls.key")
        return context

    _handshake(server, client_context("client-"), hostname=hostname)
    for anonymous_or_forged in (None, "serving-"):
        with pytest.raises(ssl.SSLError):
            _handshake(server, client_context(anonymous_or_forged), hostname=hostname)
    # the port stays fenced by the NetworkPolicy too
    policy = one_manifest(manifests, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    (rule,) = policy["spec"]["ingress"]
    # the webhook's port, and the plain-HTTP probes' port the kubelet asks
    assert rule["ports"] == [
        {"port": "https", "protocol": "TCP"},
        {"port": "probes", "protocol": "TCP"},
    ]


def test_a_webhook_answering_anyone_must_be_asked_for_explicitly(helm: Helm) -> None:
    refused = helm.run(
        "template",
        "ff",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "webhook.clientAuth.generate=false",
        check=False,
    )
    assert refused.returncode != 0
    assert "set webhook.clientAuth.acceptAnyClient=true to allow that" in refused.stderr
    contradiction = helm.run(
        "template",
        "ff",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "webhook.clientAuth.acceptAnyClient=true",
        "--set",
        "webhook.clientAuth.existingConfigMap=apiserver-ca",
        check=False,
    )
    assert contradiction.returncode != 0
    assert "acceptAnyClient=true contradicts" in contradiction.stderr
    manifests = helm.template({"webhook": {"clientAuth": {"acceptAnyClient": True}}})
    pod = webhook_pod(manifests)
    assert "--client-ca=none" in pod["containers"][0]["command"]
    assert "client-ca" not in {v["name"] for v in pod["volumes"]}
    assert not [m for m in manifests if m["metadata"]["name"].endswith("-webhook-client")]


def test_with_cert_manager_the_client_certificate_comes_from_a_ca_of_its_own(
    helm: Helm,
) -> None:
    manifests = helm.template({"webhook": {"certManager": {"enabled": True}}})
    client = _named(manifests, "Certificate", "ff-flowforge-webhook-client")
    assert client["spec"]["usages"] == ["client auth", "digital signature", "key encipherment"]
    assert client["spec"]["issuerRef"]["name"] == "ff-flowforge-webhook-client-ca"
    issuer = _named(manifests, "Issuer", "ff-flowforge-webhook-client-ca")
    authority = _named(manifests, "Certificate", "ff-flowforge-webhook-client-ca")
    assert authority["spec"]["isCA"] is True
    assert issuer["spec"]["ca"]["secretName"] == authority["spec"]["secretName"]
    assert authority["spec"]["issuerRef"]["name"] == "ff-flowforge-webhook-client-root"
    pod = webhook_pod(manifests)
    assert f"--client-ca={CLIENT_CA_PATH}" in pod["containers"][0]["command"]
    volume = next(v for v in pod["volumes"] if v["name"] == "client-ca")
    # only the CA of the client Secret is mounted, never its key
    assert volume["secret"] == {
        "secretName": "ff-flowforge-webhook-client",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }


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
    config_map = one_manifest(manifests, "ConfigMap")
    assert config_map["data"]["ca.crt"].strip() == ca_pem.strip()
    # a CA of the apiserver's own: the chart generates no client certificate
    assert not [m for m in manifests if m["metadata"]["name"].endswith("-webhook-client")]
    pod = webhook_pod(manifests)
    assert f"--client-ca={CLIENT_CA_PATH}" in pod["containers"][0]["command"]
    volume = next(v for v in pod["volumes"] if v["name"] == "client-ca")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["client-ca"]["readOnly"] is True
    (rule,) = one_manifest(manifests, "NetworkPolicy")["spec"]["ingress"]
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
