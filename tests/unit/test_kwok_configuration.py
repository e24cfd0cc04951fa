"""The kwokctl configuration of a local cluster: loopback, our ports, optional KCM limits, and
the apiserver's client certificate for webhooks."""

from __future__ import annotations

from pathlib import Path

import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from flowforge.localdev.kwokconfig import (
    ClusterPorts,
    kwokctl_configuration,
    stages_file,
    write_admission_configuration,
    write_config,
)

PORTS = ClusterPorts(
    apiserver=1, etcd=2, etcd_peer=3, controller_manager=4, scheduler=5, kwok_controller=6
)


def _patches(configuration: dict[str, object]) -> dict[str, dict[str, str]]:
    patches = configuration["componentsPatches"]
    assert isinstance(patches, list)
    return {
        patch["name"]: {arg["key"]: arg["value"] for arg in patch["extraArgs"]} for patch in patches
    }


def test_by_default_the_controller_manager_keeps_its_own_client_limits() -> None:
    configuration = kwokctl_configuration(
        bin_dir=Path("/bin"), ports=PORTS, kube_version="v1.34.4", kwok_version="v0.8.0"
    )

    assert _patches(configuration) == {"kwok-controller": {"node-ip": "127.0.0.1"}}
    options = configuration["options"]
    assert isinstance(options, dict)
    assert options["bindAddress"] == "127.0.0.1" and options["kubeApiserverPort"] == 1


def test_a_controller_manager_qps_lifts_its_rate_burst_and_job_workers() -> None:
    configuration = kwokctl_configuration(
        bin_dir=Path("/bin"),
        ports=PORTS,
        kube_version="v1.34.4",
        kwok_version="v0.8.0",
        controller_manager_qps=200,
    )

    assert _patches(configuration)["kube-controller-manager"] == {
        "kube-api-qps": "200",
        "kube-api-burst": "400",
        "concurrent-job-syncs": "50",
    }


def test_the_apiserver_presents_a_client_certificate_to_every_webhook(tmp_path: Path) -> None:
    admission, client = write_admission_configuration(tmp_path / "admission")
    configuration = kwokctl_configuration(
        bin_dir=Path("/bin"),
        ports=PORTS,
        kube_version="v1.34.4",
        kwok_version="v0.8.0",
        admission_configuration=admission,
    )

    assert _patches(configuration)["kube-apiserver"] == {
        "admission-control-config-file": str(admission)
    }
    plugins = yaml.safe_load(admission.read_text())["plugins"]
    assert {plugin["name"] for plugin in plugins} == {
        "ValidatingAdmissionWebhook",
        "MutatingAdmissionWebhook",
    }
    kubeconfig = yaml.safe_load(Path(plugins[0]["configuration"]["kubeConfigFile"]).read_text())
    (user,) = kubeconfig["users"]
    assert user["name"] == "*"
    assert user["user"] == {
        "client-certificate": str(client.cert_path),
        "client-key": str(client.key_path),
    }
    certificate = x509.load_pem_x509_certificate(client.cert_path.read_bytes())
    authority = x509.load_pem_x509_certificate(client.ca_cert_path.read_bytes())
    certificate.verify_directly_issued_by(authority)
    usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.key_path.stat().st_mode & 0o077 == 0


def test_extra_stages_follow_flowforge_s_own(tmp_path: Path) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "# a benchmark's own outcome\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\n"
        "metadata:\n  name: bench-extra\n"
    )
    config = tmp_path / "kwokctl.yaml"
    write_config(
        config,
        bin_dir=Path("/bin"),
        ports=PORTS,
        kube_version="v1.34.4",
        kwok_version="v0.8.0",
        extra_stages=[extra],
    )

    documents = list(yaml.safe_load_all(config.read_text()))
    ours = [doc["metadata"]["name"] for doc in yaml.safe_load_all(stages_file().read_text())]
    assert documents[0]["kind"] == "KwokctlConfiguration"
    assert [doc["metadata"]["name"] for doc in documents[1:]] == [*ours, "bench-extra"]
