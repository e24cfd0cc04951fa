"""The chart wires each component's probes to /healthz and /readyz (the read API's and the
webhook's on a port of their own) and passes the DB limits."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.operator.settings import OperatorSettings
from tests.plugins.helm import Helm

pytestmark = pytest.mark.cluster


def _container(helm: Helm, values: dict[str, Any], component: str) -> dict[str, Any]:
    deployment = next(
        m
        for m in helm.template(values)
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith(f"-{component}")
    )
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _operator_container(helm: Helm, values: dict[str, Any]) -> dict[str, Any]:
    return _container(helm, values, "operator")


def _probed_on_the_probes_port(container: dict[str, Any], *, startup: str) -> None:
    for probe, path in (
        ("startupProbe", startup),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "probes"}, probe


def test_probes_are_the_loop_heartbeat_and_the_database_check(helm: Helm) -> None:
    container = _operator_container(helm, {})
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["health"] == 8081
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "health"}, probe


def test_database_limits_reach_the_operator_settings(helm: Helm) -> None:
    values = {
        "operator": {
            "storeWaitSeconds": 3,
            "database": {"statementTimeoutSeconds": 7, "lockTimeoutSeconds": 2},
            "health": {"loopStallSeconds": 4},
        }
    }
    container = _operator_container(helm, values)
    environment = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = OperatorSettings.from_environment(environment)
    assert settings.store_limits.statement_timeout_seconds == 7.0
    assert settings.store_limits.lock_timeout_seconds == 2.0
    assert settings.store_limits.idle_in_transaction_seconds == 30.0
    assert (settings.store_wait_seconds, settings.loop_stall_seconds) == (3.0, 4.0)
    assert settings.health_port == 8081
    assert settings.store_pool_size == 0  # sized to the workers


def test_the_read_api_is_probed_on_a_port_of_its_own(helm: Helm) -> None:
    container = _container(helm, {}, "server")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8080, "probes": 8081}
    assert "--probe-port=8081" in container["command"]
    # probes answered while idle clients hold every connection of the API's port
    _probed_on_the_probes_port(container, startup="/healthz")


def test_the_webhook_is_probed_in_plain_http_on_a_port_of_its_own(helm: Helm) -> None:
    container = _container(helm, {}, "webhook")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"https": 9443, "probes": 8081}
    assert {"--probe-port=8081", "--probe-addr=$(POD_IP)"} <= set(container["command"])
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # a TCP check passes while the TLS port refuses every review; these answer over HTTP,
    # and the webhook has started once its TLS listener serves
    _probed_on_the_probes_port(container, startup="/readyz")
