"""Structural OpenAPI v3 schemas for CustomResourceDefinitions, from JSON Schemas.

A CRD needs a *structural* schema: no ``$ref``, no ``additionalProperties: false`` (the
apiserver prunes unknown fields and kubectl's strict field validation rejects them), no
``uniqueItems`` (``x-kubernetes-list-type: set`` says it), ``nullable`` instead of a null
type. `to_structural` translates; `resource_schema`, `crd` and `column` build the rest of
a FlowForge CRD around it. Each kind's CRD is in `crdgen` (and `policy_crd`).
"""

from __future__ import annotations

import copy
from typing import Any

from flowforge.domain.api import API_VERSION, CATEGORY, GROUP, VERSION

Schema = dict[str, Any]


# Keywords carried over unchanged (after their sub-schemas are translated).
_KEPT = frozenset(
    {
        "type",
        "description",
        "required",
        "enum",
        "format",
        "pattern",
        "multipleOf",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "nullable",
    }
)
# Keywords that document or default but do not constrain a Kubernetes object.
_DROPPED = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "$defs",
        "definitions",
        "title",
        "default",
        "examples",
        "readOnly",
        "writeOnly",
        "deprecated",
    }
)
_SCALAR_TYPES = frozenset({"string", "integer", "number", "boolean"})


class SchemaTranslationError(ValueError):
    """The JSON Schema uses a construct a structural schema cannot express."""


def to_structural(schema: Schema) -> Schema:
    """Translate a JSON Schema (with its $defs) into a structural OpenAPI v3 schema."""
    return _translate(schema, defs=schema.get("$defs", {}), path="")


def _resolve(schema: Schema, defs: Schema, path: str) -> Schema:
    """Inline $ref (and pydantic's single-element allOf wrapper); siblings win."""
    merged = dict(schema)
    if "allOf" in merged and len(merged["allOf"]) == 1:
        merged = {**merged.pop("allOf")[0], **merged}
    if "$ref" in merged:
        name = merged.pop("$ref").removeprefix("#/$defs/")
        if name not in defs:
            raise SchemaTranslationError(f"{path or '/'}: unresolvable $ref to {name}")
        merged = {**_resolve(defs[name], defs, path), **merged}
    return merged


def _without_null(schema: Schema) -> Schema:
    """Turn `anyOf [X, null]` and `type: [X, null]` into X with nullable: true."""
    result = dict(schema)
    branches = result.get("anyOf")
    if branches and any(branch.get("type") == "null" for branch in branches):
        rest = [branch for branch in branches if branch.get("type") != "null"]
        del result["anyOf"]
        result["nullable"] = True
        if len(rest) == 1:
            result = {**rest[0], **result}
        else:
            result["anyOf"] = rest
    if isinstance(result.get("type"), list):
        types = [kind for kind in result["type"] if kind != "null"]
        if len(types) != 1:
            raise SchemaTranslationError(f"union type {result['type']} is not structural")
        if "null" in result["type"]:
            result["nullable"] = True
        result["type"] = types[0]
    return result


def _translate(schema: Schema, *, defs: Schema, path: str) -> Schema:
    source = _resolve(_without_null(_resolve(schema, defs, path)), defs, path)
    out: Schema = {}
    for key, value in source.items():
        where = f"{path}/{key}"
        if key in _DROPPED:
            continue
        if key in _KEPT or key.startswith("x-kubernetes-"):
            out[key] = copy.deepcopy(value)
        elif key == "properties":
            out[key] = {
                name: _translate(sub, defs=defs, path=f"{where}/{name}")
                for name, sub in value.items()
            }
        elif key == "items":
            out[key] = _translate(value, defs=defs, path=where)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _translate(value, defs=defs, path=where)
            elif value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # false: closed objects are the apiserver's default (unknown fields pruned)
        elif key == "const":
            out["enum"] = [copy.deepcopy(value)]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            if isinstance(value, bool):
                out[key] = value
            else:
                out[bound] = value
                out[key] = True
        elif key == "uniqueItems":
            if value:
                out.update(_unique_items(source, where))
        elif key == "anyOf" and source.get("x-kubernetes-int-or-string"):
            out.update(_int_or_string(value, where))
        else:
            raise SchemaTranslationError(f"{where}: keyword {key!r} has no structural equivalent")
    return _ordered(out)


def _ordered(schema: Schema) -> Schema:
    """type and description first, then the other keywords alphabetically: stable, readable."""
    first = [key for key in ("type", "description") if key in schema]
    rest = sorted(key for key in schema if key not in first)
    return {key: schema[key] for key in first + rest}


def _int_or_string(branches: list[Schema], where: str) -> Schema:
    """The only anyOf a structural schema allows with types is exactly
    [{type: integer}, {type: string}]; a branch's other keywords (maxLength, pattern)
    constrain just its own type, so they move up to the parent unchanged."""
    if sorted(branch.get("type", "") for branch in branches) != ["integer", "string"]:
        raise SchemaTranslationError(f"{where}: int-or-string needs an integer and a string branch")
    hoisted: Schema = {}
    for branch in branches:
        hoisted.update({key: value for key, value in branch.items() if key != "type"})
    return {"anyOf": [{"type": "integer"}, {"type": "string"}], **hoisted}


def _unique_items(array: Schema, where: str) -> Schema:
    item_type = array.get("items", {}).get("type")
    if item_type not in _SCALAR_TYPES:
        raise SchemaTranslationError(f"{where}: uniqueItems on non-scalar items ({item_type})")
    return {"x-kubernetes-list-type": "set"}


def resource_schema(*, kind: str, description: str, spec: Schema, status: Schema) -> Schema:
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": f"Versioned schema of this object: {API_VERSION}.",
            },
            "kind": {"type": "string", "description": f"The REST resource kind: {kind}."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd(
    *, kind: str, plural: str, short_name: str, schema: Schema, columns: list[Schema]
) -> Schema:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def column(name: str, kind: str, json_path: str, description: str) -> Schema:
    return {"name": name, "type": kind, "jsonPath": json_path, "description": description}
