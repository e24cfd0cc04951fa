"""A conservative, compiled validity check for the subset of JSON Schema the spec uses.

``jsonschema`` reports every error with its path but spends microseconds per keyword; on a
10,000-task definition that is most of the validation time. This module translates the schema,
once, into a pydantic-core validator (strict: no coercion) that answers only "certainly
valid?" in Rust. A ``True`` is as good as jsonschema's verdict (tests compare the two); a
``False`` may be pessimistic (an integral float such as ``2.0``, say) and sends the caller to
jsonschema for the real errors. A keyword it does not understand is a compile error, so the
schema cannot grow a rule this check silently skips.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic_core import SchemaValidator
from pydantic_core import core_schema as cs

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"$schema", "description", "title", "default", "examples"})
_KEYWORDS_BY_TYPE: dict[str | None, frozenset[str]] = {
    "string": frozenset({"type", "minLength", "maxLength", "pattern", "enum"}),
    "integer": frozenset({"type", "minimum", "maximum"}),
    "number": frozenset({"type"}),
    "boolean": frozenset({"type"}),
    "array": frozenset({"type", "items", "minItems", "maxItems", "uniqueItems"}),
    "object": frozenset(
        {"type", "properties", "required", "additionalProperties", "minProperties", "maxProperties"}
    ),
    None: frozenset({"anyOf"}),
}


def go_compatible_pattern(pattern: str) -> re.Pattern[str]:
    """Compile an ECMA/RE2-style pattern so that a final ``$`` means the end of the text.

    Python's ``$`` also matches before a trailing newline, which Kubernetes (Go regexp) does
    not; ``"etl\\n"`` must not pass as a DNS-1123 label here and fail in the cluster. (The
    Rust regex engine pydantic-core uses already reads ``$`` as Go does.)
    """
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _unique_strings(items: list[Any]) -> list[Any]:
    if len(set(items)) != len(items):
        raise ValueError("duplicate items")
    return items


def translate(schema: Mapping[str, Any]) -> cs.CoreSchema:
    """The strict pydantic-core schema accepting only instances valid under ``schema``."""
    keywords = {
        keyword: argument
        for keyword, argument in schema.items()
        if keyword not in _ANNOTATIONS and not keyword.startswith("x-kubernetes-")
    }
    kind = keywords.get("type")
    allowed = _KEYWORDS_BY_TYPE.get(kind)
    if allowed is None or not set(keywords) <= allowed:
        raise ValueError(f"fastcheck cannot compile the JSON Schema keywords {sorted(keywords)}")
    if not keywords:  # no constraint (a free JSON value): any JSON value
        return _JSON_VALUE
    if kind is None:
        return cs.union_schema([translate(alternative) for alternative in keywords["anyOf"]])
    if kind == "string":
        if "enum" in keywords:
            if set(keywords) != {"type", "enum"} or not all(
                type(item) is str for item in keywords["enum"]
            ):
                raise ValueError("fastcheck cannot compile this enum")
            return cs.literal_schema(list(keywords["enum"]))
        return cs.str_schema(
            min_length=keywords.get("minLength"),
            max_length=keywords.get("maxLength"),
            pattern=keywords.get("pattern"),
            strict=True,
        )
    if kind == "integer":
        return cs.int_schema(ge=keywords.get("minimum"), le=keywords.get("maximum"), strict=True)
    if kind == "boolean":
        return cs.bool_schema(strict=True)
    if kind == "number":
        return cs.union_schema(
            [cs.int_schema(strict=True), cs.float_schema(strict=True, allow_inf_nan=False)]
        )
    if kind == "array":
        return _translate_array(keywords)
    return _translate_object(keywords)


def _translate_array(keywords: Mapping[str, Any]) -> cs.CoreSchema:
    items = keywords.get("items", {})
    array = cs.list_schema(
        translate(items) if items else cs.any_schema(),
        min_length=keywords.get("minItems"),
        max_length=keywords.get("maxItems"),
        strict=True,
    )
    if not keywords.get("uniqueItems"):
        return array
    if items.get("type") != "string":
        raise ValueError("fastcheck compiles uniqueItems only for arrays of strings")
    return cs.no_info_after_validator_function(_unique_strings, array)


def _translate_object(keywords: Mapping[str, Any]) -> cs.CoreSchema:
    properties: Mapping[str, Any] | None = keywords.get("properties")
    extra = keywords.get("additionalProperties", True)
    if properties is not None:
        if extra is not False or "minProperties" in keywords or "maxProperties" in keywords:
            raise ValueError("fastcheck compiles declared properties only as a closed object")
        required = set(keywords.get("required", ()))
        return cs.typed_dict_schema(
            {
                name: cs.typed_dict_field(translate(subschema), required=name in required)
                for name, subschema in properties.items()
            },
            extra_behavior="forbid",
            strict=True,
        )
    if "required" in keywords or extra is False:
        raise ValueError("fastcheck cannot compile this object schema")
    return cs.dict_schema(
        cs.str_schema(strict=True),
        _JSON_VALUE if extra is True else translate(extra),
        min_length=keywords.get("minProperties"),
        max_length=keywords.get("maxProperties"),
        strict=True,
    )


# Any value JSON can carry (finite numbers, string keys): what a free-form object may hold.
# Defined once at the root of the compiled schema (`compile_check`) and referenced wherever
# the schema has a free value.
_JSON_VALUE = cs.definition_reference_schema("json")
_JSON_DEFINITION = cs.union_schema(
    [
        cs.none_schema(),
        cs.bool_schema(strict=True),
        cs.int_schema(strict=True),
        cs.float_schema(strict=True, allow_inf_nan=False),
        cs.str_schema(strict=True),
        cs.list_schema(cs.definition_reference_schema("json"), strict=True),
        cs.dict_schema(
            cs.str_schema(strict=True), cs.definition_reference_schema("json"), strict=True
        ),
    ],
    ref="json",
)


def compile_check(schema: Mapping[str, Any]) -> Check:
    """Compile ``schema`` into a predicate that is ``True`` only for valid instances."""
    validator = SchemaValidator(cs.definitions_schema(translate(schema), [_JSON_DEFINITION]))

    def check(instance: Any) -> bool:
        return bool(validator.isinstance_python(instance))

    return check
