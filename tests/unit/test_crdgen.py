"""The checked-in CRDs are the generator's output, and that output is structural."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from flowforge.kube.crdgen import default_out_dir, main, rendered_crds
from flowforge.kube.structural import SchemaTranslationError, to_structural

SchemaNode = tuple[str, dict[str, Any]]


def _walk(schema: dict[str, Any], path: str) -> Iterator[SchemaNode]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")
    for index, branch in enumerate(schema.get("anyOf", [])):
        yield from _walk(branch, f"{path}|{index}")


def _crd_schemas() -> list[tuple[str, dict[str, Any]]]:
    schemas = []
    for name, text in rendered_crds().items():
        crd = yaml.safe_load(text)
        schemas.append((name, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
    return schemas


def test_checked_in_crds_are_up_to_date() -> None:
    for name, text in rendered_crds().items():
        checked_in = default_out_dir() / name
        assert checked_in.exists(), f"{checked_in} missing: run python -m flowforge.kube.crdgen"
        assert checked_in.read_text() == text, (
            f"{checked_in} is out of date: run python -m flowforge.kube.crdgen"
        )


def test_check_mode_reports_a_stale_folder(tmp_path: Any) -> None:
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--check", "--out", str(tmp_path)]) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(rendered_crds())


def test_rendering_is_deterministic() -> None:
    assert rendered_crds() == rendered_crds()


def test_no_closed_objects_or_forbidden_keywords_anywhere() -> None:
    forbidden = {"$ref", "$defs", "$schema", "uniqueItems", "title", "default", "const"}
    for crd, schema in _crd_schemas():
        for path, node in _walk(schema, "$"):
            assert node.get("additionalProperties") is not False, f"{crd} {path}"
            assert not forbidden & node.keys(), f"{crd} {path}: {forbidden & node.keys()}"
            assert not isinstance(node.get("type"), list), f"{crd} {path}"


def test_every_property_has_a_type_and_a_description() -> None:
    for crd, schema in _crd_schemas():
        for path, node in _walk(schema, "$"):
            if "|" in path:
                continue  # the branches of an int-or-string
            # a free JSON value (a parameter's default) is the one untyped node Kubernetes allows
            has_type = (
                "type" in node
                or node.get("x-kubernetes-int-or-string")
                or node.get("x-kubernetes-preserve-unknown-fields")
            )
            assert has_type, f"{crd} {path} has no type"
            is_property = not path.endswith(("[]", "{}", "$"))
            if is_property and path != "$.metadata":  # metadata is Kubernetes' own
                assert node.get("description"), f"{crd} {path} has no description"


def test_free_form_config_is_preserved() -> None:
    schemas = dict(_crd_schemas())
    definition = schemas["workflowdefinitions.flowforge.io.yaml"]
    config = definition["properties"]["spec"]["properties"]["tasks"]["items"]["properties"][
        "config"
    ]
    assert config["type"] == "object"
    assert config["x-kubernetes-preserve-unknown-fields"] is True


def test_unique_scalar_lists_become_sets() -> None:
    definition = dict(_crd_schemas())["workflowdefinitions.flowforge.io.yaml"]
    depends_on = definition["properties"]["spec"]["properties"]["tasks"]["items"]["properties"][
        "dependsOn"
    ]
    assert depends_on["x-kubernetes-list-type"] == "set"


def test_translation_of_json_schema_constructs() -> None:
    source = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "description": "root",
        "additionalProperties": False,
        "$defs": {"Color": {"type": "string", "enum": ["red"], "title": "Color"}},
        "properties": {
            "color": {"$ref": "#/$defs/Color", "description": "a color"},
            "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}], "description": "m"},
            "above": {"type": "number", "exclusiveMinimum": 0, "description": "a"},
            "fixed": {"const": "x", "type": "string", "description": "f"},
        },
    }
    assert to_structural(source) == {
        "type": "object",
        "description": "root",
        "properties": {
            "color": {"type": "string", "description": "a color", "enum": ["red"]},
            "maybe": {"type": "integer", "description": "m", "nullable": True},
            "above": {"type": "number", "description": "a", "exclusiveMinimum": True, "minimum": 0},
            "fixed": {"type": "string", "description": "f", "enum": ["x"]},
        },
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "patternProperties": {"^a": {"type": "string"}}},
        {"type": "array", "uniqueItems": True, "items": {"type": "object"}},
        {"type": ["string", "integer"]},
    ],
)
def test_untranslatable_constructs_are_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaTranslationError):
        to_structural(schema)


def test_names_columns_and_subresources() -> None:
    for text in rendered_crds().values():
        crd = yaml.safe_load(text)
        spec = crd["spec"]
        assert spec["group"] == "flowforge.io"
        assert spec["scope"] == "Namespaced"
        assert spec["names"]["categories"] == ["flowforge"]
        version = spec["versions"][0]
        assert version["name"] == "v1alpha1"
        columns = [column["name"] for column in version["additionalPrinterColumns"]]
        if spec["names"]["kind"] == "FlowForgePolicy":
            # written by admins only and read by admission: it has no status
            assert "subresources" not in version
            assert spec["names"]["shortNames"] == ["ffpolicy"]
            assert columns == ["ServiceAccounts", "Registries", "Age"]
            continue
        assert version["subresources"] == {"status": {}}
        if spec["names"]["kind"] == "WorkflowRunAction":
            assert spec["names"]["shortNames"] == ["wfa"]
            assert columns == ["Run", "Action", "Actor", "Result", "Age"]
            continue
        if spec["names"]["kind"] == "WorkflowRun":
            assert spec["names"]["shortNames"] == ["wfr"]
            assert columns == [
                "Workflow",
                "Version",
                "Phase",
                "Progress",
                "Priority",
                "Queue",
                "Position",
                "Age",
            ]
        elif spec["names"]["kind"] == "WorkflowSchedule":
            assert spec["names"]["shortNames"] == ["wfs"]
            assert columns == [
                "Schedule",
                "Time Zone",
                "Suspended",
                "Last Fire",
                "Next Fire",
                "Active",
                "Age",
            ]
        else:
            assert spec["names"]["shortNames"] == ["wfd"]
            assert columns == ["Workflow", "Version", "Tasks", "Age"]
