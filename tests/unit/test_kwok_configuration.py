"""The kwokctl configuration of a local cluster: loopback, our ports, optional KCM limits."""

from __future__ import annotations

from pathlib import Path

from flowforge.localdev.kwokconfig import ClusterPorts, kwokctl_configuration

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


def test_a_controller_manager_qps_lifts_its_rate_and_burst() -> None:
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
    }
