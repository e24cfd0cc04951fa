"""The Helm chart's files on their own (no helm, no cluster): CRDs in sync with crds/,
values that pass their own schema, a hardened default, and an image built as promised."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jsonschema
import yaml

from flowforge.localdev.binaries import repo_root

ROOT = repo_root()
CHART = ROOT / "charts" / "flowforge"


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _schema_errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(_schema())
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(values)
    ]


def test_chart_crds_are_the_checked_in_crds() -> None:
    top = {path.name: path.read_bytes() for path in (ROOT / "crds").glob("*.yaml")}
    chart = {path.name: path.read_bytes() for path in (CHART / "crds").glob("*.yaml")}
    assert top, "crds/ is empty"
    assert sorted(chart) == sorted(top), "copy crds/*.yaml into charts/flowforge/crds/"
    stale = [name for name in top if chart[name] != top[name]]
    assert not stale, f"charts/flowforge/crds/ differs from crds/ for {stale}: copy them again"


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    assert version is not None
    assert chart["appVersion"] == version[1]
    assert chart["apiVersion"] == "v2" and chart["name"] == "flowforge"


def test_default_values_satisfy_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(_schema())
    assert _schema_errors(_values()) == []


def test_schema_refuses_a_misspelt_key_and_loosened_security() -> None:
    values = _values()
    values["operator"]["replica"] = 2
    values["containerSecurityContext"]["readOnlyRootFilesystem"] = False
    errors = _schema_errors(values)
    assert any(e.startswith("operator:") and "'replica'" in e for e in errors), errors
    assert any(e.startswith("containerSecurityContext/readOnlyRootFilesystem") for e in errors)


def test_schema_requires_a_database_unless_bundled() -> None:
    values = _values()
    values["database"]["existingSecret"] = ""
    assert any(e.startswith("database/existingSecret") for e in _schema_errors(values))
    values["database"]["bundled"]["enabled"] = True
    assert _schema_errors(values) == []


def test_default_security_context_is_hardened() -> None:
    values = _values()
    pod = values["podSecurityContext"]
    container = values["containerSecurityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["allowPrivilegeEscalation"] is False
    assert container["readOnlyRootFilesystem"] is True
    assert container["capabilities"] == {"drop": ["ALL"]}


def test_dockerfile_is_multi_stage_pinned_non_root_and_installs_into_a_venv() -> None:
    # tests/e2e/test_image.py builds and runs it; this checks what a Docker build would use
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None, "the base image is a build argument with a pinned default"
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base[1]), base[1]
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert stages == ["${BASE_IMAGE}", "deps", "${BASE_IMAGE}"]
    assert "python3 -m venv --without-pip /opt/flowforge" in text
    assert "COPY --from=deps /opt/flowforge /opt/flowforge" in text
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user and re.fullmatch(r"[1-9]\d*:[1-9]\d*", user[-1]), user
    # the uid the chart verifies with runAsNonRoot is the one the image runs as
    assert user[-1].split(":")[0] == str(_values()["podSecurityContext"]["runAsUser"])


def test_dockerignore_keeps_the_build_context_to_the_package() -> None:
    lines = (ROOT / ".dockerignore").read_text().split("\n")
    assert "*" in lines and "!operator/" in lines and "!pyproject.toml" in lines


def test_kind_files_exist_and_parse() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "kind" / "kind-config.yaml").read_text())
    assert config["kind"] == "Cluster"
    assert config["networking"]["apiServerAddress"] == "127.0.0.1"
    script = ROOT / "deploy" / "kind" / "e2e.sh"
    assert os.access(script, os.X_OK), "deploy/kind/e2e.sh must be executable"
    text = script.read_text()
    for step in (
        "docker build",
        "kind create cluster",
        "kind load docker-image",
        "helm",
        "examples/etl-diamond.yaml",
    ):
        assert step in text, step
    assert (ROOT / "examples" / "etl-diamond.yaml").exists()


def test_chart_readme_argues_the_webhook_deployment() -> None:
    readme = (CHART / "README.md").read_text()
    assert "Why the webhook is its own Deployment" in readme
