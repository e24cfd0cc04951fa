"""The chart wires the operator's probes to /healthz and /readyz and passes the DB limits."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.operator.settings import OperatorSettings
from tests.plugins.helm import Helm

pytestmark = pytest.mark.cluster


def _operator_container(helm: Helm, values: dict[str, Any]) -> dict[str, Any]:
    deployment = next(
        m
        for m in helm.template(values)
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-operator")
    )
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


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
    deployment = next(
        m
        for m in helm.template({})
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-server")
    )
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8080, "probes": 8081}
    assert "--probe-port=8081" in container["command"]
    # probes answered while idle clients hold every connection of the API's port
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "probes"}, probe
