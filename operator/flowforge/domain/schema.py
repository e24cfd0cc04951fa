"""Shape validation of a WorkflowDefinition's ``spec`` against its JSON Schema.

Errors carry Kubernetes-style field paths: ``spec.tasks[1].dependsOn[0]`` for list items and
schema fields, ``spec.taskTypes[py].image`` for entries of a free-named map. A missing
required field is reported at its parent object, as JSON Schema reports it; an unknown field
is reported at its own path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from flowforge.domain.errors import DefinitionSchemaError
from flowforge.domain.fastcheck import Check, compile_check, go_compatible_pattern
from flowforge.domain.k8s_grammar import PATTERN_DESCRIPTIONS
from flowforge.domain.spec_schema import (
    CONTAINER_TEMPLATE_SCHEMA,
    DEFINITION_SPEC_SCHEMA,
    TASK_SCHEMA,
)

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

__all__ = [
    "CONTAINER_TEMPLATE_SCHEMA",
    "DEFINITION_SPEC_SCHEMA",
    "TASK_SCHEMA",
    "format_path",
    "shape_errors",
]

PathPart = str | int
_MAX_SHOWN_VALUE = 60


def _pattern_keyword(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    from jsonschema.exceptions import ValidationError

    if isinstance(instance, str) and not go_compatible_pattern(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@cache
def _validator() -> Any:
    # imported here: a valid spec never needs jsonschema (the fast check answers), and the
    # import is a tenth of `flowforge plan`
    # (the schema's own validity is a unit test: checking it here cost seconds per process
    # once the Pod-spec fields made it large)
    import jsonschema

    extend: Any = jsonschema.validators.extend
    validator_class = extend(jsonschema.Draft202012Validator, {"pattern": _pattern_keyword})
    return validator_class(DEFINITION_SPEC_SCHEMA)


@cache
def _fast_check() -> Check:
    return compile_check(DEFINITION_SPEC_SCHEMA)


def shape_errors(spec: object, *, path: str = "spec") -> list[DefinitionSchemaError]:
    """Every way ``spec`` departs from the schema, in document order; empty when it fits."""
    if _fast_check()(spec):  # which also means every config value is JSON
        return []
    errors = [item for error in _validator().iter_errors(spec) for item in _explain(error)]
    if isinstance(spec, dict):
        errors.extend(_non_json_config_values(spec))
    errors.sort(key=lambda item: (_sort_key(item[0]), item[1]))
    return [
        DefinitionSchemaError(message, path=format_path(parts, root=path))
        for parts, message in errors
    ]


def format_path(parts: tuple[PathPart, ...], *, root: str = "spec") -> str:
    """Render a path into the spec: fields dotted; list indices and keys of maps bracketed."""
    rendered = [root]
    schema: Mapping[str, Any] | None = DEFINITION_SPEC_SCHEMA
    for part in parts:
        if isinstance(part, int):
            rendered.append(f"[{part}]")
            schema = _child_schema(schema, "items")
        elif schema is not None and part in schema.get("properties", {}):
            rendered.append(f".{part}")
            schema = schema["properties"][part]
        elif _child_schema(schema, "additionalProperties") is not None:
            rendered.append(f"[{part}]")
            schema = _child_schema(schema, "additionalProperties")
        else:
            rendered.append(f".{part}")
            schema = None
    return "".join(rendered)


def _child_schema(schema: Mapping[str, Any] | None, keyword: str) -> Mapping[str, Any] | None:
    child = None if schema is None else schema.get(keyword)
    return child if isinstance(child, Mapping) else None


def _sort_key(parts: tuple[PathPart, ...]) -> tuple[tuple[int, int, str], ...]:
    return tuple((0, part, "") if isinstance(part, int) else (1, 0, part) for part in parts)


def _explain(error: ValidationError) -> Iterator[tuple[tuple[PathPart, ...], str]]:
    parts: tuple[PathPart, ...] = tuple(error.absolute_path)
    keyword, argument, instance = error.validator, error.validator_value, error.instance
    if keyword == "additionalProperties" and argument is False and isinstance(instance, dict):
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        declared = schema.get("properties", {})
        for name in sorted(set(instance) - set(declared)):
            yield (*parts, name), "unknown field (not in the schema)"
        return
    yield parts, _message(keyword, argument, instance, error.message)


def _message(keyword: Any, argument: Any, instance: Any, fallback: str) -> str:
    match keyword:
        case "required":
            missing = [name for name in argument if name not in instance]
            return "missing required field " + ", ".join(f'"{name}"' for name in missing)
        case "type":
            return f"must be of type {argument}, not {json_type(instance)}"
        case "pattern":
            expected = PATTERN_DESCRIPTIONS.get(argument, f"a string matching {argument}")
            return f"{_show(instance)} is not {expected}"
        case "minLength":
            return f"must be at least {argument} characters long"
        case "maxLength":
            return f"must be at most {argument} characters long"
        case "minItems":
            return "must not be empty" if argument == 1 else f"must have at least {argument} items"
        case "maxItems":
            return f"must have at most {argument} items (has {len(instance)})"
        case "maxProperties":
            return f"must have at most {argument} entries (has {len(instance)})"
        case "minimum":
            return f"must be >= {argument}"
        case "maximum":
            return f"must be <= {argument}"
        case "uniqueItems":
            return f"has duplicate items: {_show(_first_duplicate(instance))}"
        case "enum":
            return f"must be one of {', '.join(_show(item) for item in argument)}"
        case "anyOf":
            return _any_of_message(argument, instance)
    return fallback if len(fallback) <= 200 else fallback[:197] + "..."


def _any_of_message(branches: list[Any], instance: Any) -> str:
    """Int-or-string fields: say what the string branch wants of a string that fails it."""
    for branch in branches:
        if not isinstance(instance, str) or branch.get("type") != "string":
            continue
        limit = branch.get("maxLength")
        if limit is not None and len(instance) > limit:
            return f"must be at most {limit} characters long"
        pattern = branch.get("pattern")
        if pattern is not None:
            expected = PATTERN_DESCRIPTIONS.get(pattern, f"a string matching {pattern}")
            return f"{_show(instance)} is not {expected}"
    return f"{_show(instance)} must be an integer or a string"


def _first_duplicate(items: list[Any]) -> Any:
    for index, item in enumerate(items):
        if item in items[:index]:
            return item
    return None


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)
    return text if len(text) <= _MAX_SHOWN_VALUE else text[: _MAX_SHOWN_VALUE - 3] + "..."


def json_type(value: Any) -> str:
    """The JSON Schema type name of a value read from JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _non_json_config_values(spec: Mapping[str, Any]) -> Iterator[tuple[tuple[PathPart, ...], str]]:
    """Values inside ``config`` that JSON cannot carry (a datetime, NaN, a tuple...).

    The schema leaves config free-form, so a Python caller could hand over anything; the
    error must name the task here rather than surface when the config is serialised.
    """
    tasks = spec.get("tasks")
    if not isinstance(tasks, list):
        return
    for index, task in enumerate(tasks):
        if not isinstance(task, dict) or not isinstance(task.get("config"), dict):
            continue
        stack: list[tuple[tuple[PathPart, ...], Any]] = [
            (("tasks", index, "config"), task["config"])
        ]
        while stack:
            parts, value = stack.pop()
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        yield parts, f"has a key of type {type(key).__name__}; keys must be strings"
                    else:
                        stack.append(((*parts, key), item))
            elif isinstance(value, list):
                stack.extend(((*parts, position), item) for position, item in enumerate(value))
            elif isinstance(value, float) and not math.isfinite(value):
                yield parts, f"{value!r} is not a finite number; JSON cannot carry it"
            elif value is not None and not isinstance(value, str | int | float):
                yield parts, f"a value of type {type(value).__name__} is not JSON"
