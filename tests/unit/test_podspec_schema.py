"""The Pod-spec fields of a task type come from Kubernetes' own OpenAPI, generated, in sync."""

from __future__ import annotations

import re

import pytest

from flowforge.domain.k8s_grammar import QUANTITY_PATTERN
from flowforge.domain.podspec_schema import KUBERNETES_VERSION, TEMPLATE_FIELDS
from flowforge.domain.spec_schema import CONTAINER_TEMPLATE_SCHEMA
from flowforge.kube.crdgen import workflow_definition_crd
from flowforge.kube.podspec_gen import TEMPLATE_FIELDS as GENERATED
from flowforge.kube.podspec_gen import main, pinned_kubernetes_version


def test_the_committed_schema_is_what_the_pinned_openapi_generates() -> None:
    # reads k8s.io/kubernetes' api/openapi-spec from the Go module cache (go mod download)
    assert main(["--check"]) == 0, "run: python -m flowforge.kube.podspec_gen"
    assert pinned_kubernetes_version() == KUBERNETES_VERSION


def test_every_generated_field_is_in_the_template_schema_and_the_crd() -> None:
    assert set(GENERATED) == set(TEMPLATE_FIELDS)
    crd = workflow_definition_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    template = crd["properties"]["spec"]["properties"]["taskTypes"]["additionalProperties"]
    for name in TEMPLATE_FIELDS:
        assert CONTAINER_TEMPLATE_SCHEMA["properties"][name] == TEMPLATE_FIELDS[name]
        assert name in template["properties"], name


def _walk(schema: object, path: str = "") -> list[tuple[str, dict[str, object]]]:
    if not isinstance(schema, dict):
        return []
    found = [(path, schema)]
    for name, sub in (schema.get("properties") or {}).items():
        found += _walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        found += _walk(schema.get(key), f"{path}[]")
    for branch in schema.get("anyOf") or []:
        found += _walk(branch, path)
    return found


def test_every_string_list_and_map_is_bounded() -> None:
    for path, node in _walk({"properties": TEMPLATE_FIELDS}):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
            assert "maxProperties" in node, path
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path


@pytest.mark.parametrize("text", ["1", "500m", "1.5Gi", "2Ki", "1e3", "+.5", "0.1", "128974848"])
def test_quantities_kubernetes_reads_pass(text: str) -> None:
    assert re.fullmatch(QUANTITY_PATTERN.strip("^$"), text)


@pytest.mark.parametrize("text", ["lots", "1 Gi", "1GB", "", "1.5.5", "Gi"])
def test_what_is_no_quantity_fails(text: str) -> None:
    assert not re.fullmatch(QUANTITY_PATTERN.strip("^$"), text)
