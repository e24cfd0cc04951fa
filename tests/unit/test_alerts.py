"""The chart's alert rules (charts/flowforge/files/prometheus-rules.yaml), run by Prometheus'
own `promtool test rules` on synthetic series (tests/unit/alerts/): each alert fires on its
series and stays quiet on a healthy operator. Each alert has its runbook in docs/alerts.md,
and the chart's PrometheusRule is that same file.

promtool is built from the Go module proxy by `make promtool`
(deploy/tools/build-promtool.sh, a prerequisite of `make test`); a missing binary fails."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from flowforge.localdev.binaries import repo_root

ROOT = repo_root()
RULES = ROOT / "charts" / "flowforge" / "files" / "prometheus-rules.yaml"
RULE_TESTS = ROOT / "tests" / "unit" / "alerts" / "prometheus-rules.test.yaml"
BUILD_SCRIPT = ROOT / "deploy" / "tools" / "build-promtool.sh"


def _promtool() -> Path:
    version = re.search(r"^PROMTOOL_VERSION=(\S+)$", BUILD_SCRIPT.read_text(), re.MULTILINE)
    assert version is not None, f"no PROMTOOL_VERSION in {BUILD_SCRIPT}"
    cache = Path(os.environ.get("FLOWFORGE_CACHE") or Path.home() / ".cache" / "flowforge")
    binary = cache / "promtool" / version[1] / "promtool"
    assert binary.is_file(), (
        f"{binary} is missing: run `make promtool` (a prerequisite of make test)"
    )
    return binary


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", RULES], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_fires_on_its_series_and_is_quiet_when_healthy() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", RULE_TESTS],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    names = {rule["alert"] for rule in _alerts()}
    assert len(names) == len(_alerts()) == 10
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    firing = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert names - firing == set(), "alerts never seen firing"
    assert names - quiet == set(), "alerts never seen quiet"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_every_alert_has_a_runbook() -> None:
    runbook = (ROOT / "docs" / "alerts.md").read_text()
    headings = set(re.findall(r"^## (\S+)$", runbook, re.MULTILINE))
    for rule in _alerts():
        name = rule["alert"]
        assert name in headings, f"docs/alerts.md has no section ## {name}"
        assert rule["annotations"]["runbook"] == f"docs/alerts.md#{name.lower()}"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        section = runbook.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Means**", "**Check**", "**Do**"):
            assert part in section, f"the runbook of {name} lacks {part}"


def test_the_chart_renders_the_same_file() -> None:
    template = (ROOT / "charts" / "flowforge" / "templates" / "prometheusrule.yaml").read_text()
    assert '.Files.Get "files/prometheus-rules.yaml"' in template
    assert 'Has "monitoring.coreos.com/v1/PrometheusRule"' in template
