"""Typed run parameters: a definition's ``spec.parameters`` declarations and a run's values.

A declaration is a JSON Schema subset (type string, integer, number, boolean, array or
object; ``enum``, ``pattern``, ``minimum``/``maximum``, ``minItems``/``maxItems``, ``items``;
``default``; ``required`` when there is no default). The schema of each declaration
(``value_schema``) is checked with ``jsonschema``, patterns read as Kubernetes reads them.

``effective_parameters(definition, raw)`` is the one check of a run's parameters against its
definition, used by admission (webhook, schedules) and by the run's expansion: an unknown name,
a wrong type, a value outside its constraints and a missing required parameter are refused
naming ``spec.parameters.<name>``; what it returns has the defaults filled in (what the run
records). A definition that declares nothing keeps the free string parameters it always had.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from flowforge.domain.errors import DefinitionError, DefinitionSchemaError, UserError
from flowforge.domain.fastcheck import go_compatible_pattern
from flowforge.domain.schema import json_type

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

    from flowforge.domain.models import DefinitionSpec, ParameterSpec

# keywords each type may carry (besides type), in a declaration and in an ``items`` schema
_KEYWORDS: Final[Mapping[str, frozenset[str]]] = {
    "string": frozenset({"enum", "pattern", "minLength", "maxLength"}),
    "integer": frozenset({"enum", "minimum", "maximum"}),
    "number": frozenset({"enum", "minimum", "maximum"}),
    "boolean": frozenset({"enum"}),
    "array": frozenset({"enum", "minItems", "maxItems", "items"}),
    "object": frozenset({"enum"}),
}
_DECLARATION_FIELDS: Final = {
    "enum": "enum",
    "pattern": "pattern",
    "minimum": "minimum",
    "maximum": "maximum",
    "min_items": "minItems",
    "max_items": "maxItems",
    "items": "items",
}
MAX_ITEMS_DEPTH: Final = 4
PARAMETERS_PATH: Final = "spec.parameters"


class ParameterError(UserError):
    """A run's parameters do not fit its definition's declarations; ``errors`` lists
    (field path, message) pairs, each path ``spec.parameters.<name>``."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = tuple(errors)
        # one line (a CLI prints one); admission lists ``errors`` one per line
        super().__init__("; ".join(f"{path}: {message}" for path, message in self.errors))


def parameter_path(name: str) -> str:
    return f"{PARAMETERS_PATH}.{name}"


def value_schema(declaration: ParameterSpec) -> dict[str, Any]:
    """The JSON Schema a value of the declared parameter must satisfy."""
    schema: dict[str, Any] = {"type": declaration.type}
    for attribute, keyword in _DECLARATION_FIELDS.items():
        value = getattr(declaration, attribute)
        if value is not None:
            schema[keyword] = list(value) if keyword == "enum" else value
    return schema


def _validator(schema: Mapping[str, Any]) -> Any:
    return _validator_class()(schema)


@cache
def _validator_class() -> Any:
    import jsonschema

    def pattern(
        validator: Any, regex: str, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        from jsonschema.exceptions import ValidationError

        if isinstance(instance, str) and not go_compatible_pattern(regex).search(instance):
            yield ValidationError(f"{instance!r} does not match the pattern {regex!r}")

    extend: Any = jsonschema.validators.extend
    return extend(jsonschema.Draft202012Validator, {"pattern": pattern})


def _value_errors(schema: Mapping[str, Any], value: Any, *, path: str) -> list[tuple[str, str]]:
    errors = sorted(_validator(schema).iter_errors(value), key=lambda error: list(error.path))
    return [
        (path + "".join(f"[{part}]" for part in error.absolute_path), _message(error))
        for error in errors
    ]


def _message(error: ValidationError) -> str:
    if error.validator == "type":
        return f"must be of type {error.validator_value}, not {json_type(error.instance)}"
    if error.validator == "enum":
        values: Any = error.validator_value
        allowed = ", ".join(json.dumps(value) for value in values)
        return f"must be one of {allowed}"
    return str(error.message)


def _normalised(value: Any) -> Any:
    """An integral float (``2.0`` from some clients) as the integer Kubernetes stores."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list | tuple):
        # a list of strings (a forEach's usual items) needs no call per item
        return [item if type(item) is str else _normalised(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _normalised(item) for key, item in value.items()}
    return value


def declaration_errors(definition: DefinitionSpec) -> list[DefinitionError]:
    """The rules of ``spec.parameters`` a JSON Schema cannot say, for a spec whose shape is
    valid: unique names, keywords that fit the type, a well-formed ``items`` schema and
    pattern, and an ``enum`` and ``default`` that the declaration itself admits."""
    errors: list[DefinitionError] = []
    first: dict[str, int] = {}
    for index, declaration in enumerate(definition.parameters):
        where = f"{PARAMETERS_PATH}[{index}]"
        if declaration.name in first:
            errors.append(
                DefinitionSchemaError(
                    f"duplicate parameter {declaration.name!r} (first declared at "
                    f"{PARAMETERS_PATH}[{first[declaration.name]}])",
                    path=f"{where}.name",
                )
            )
        first.setdefault(declaration.name, index)
        errors.extend(_declaration_errors(declaration, where=where))
    return errors


def _declaration_errors(declaration: ParameterSpec, *, where: str) -> list[DefinitionError]:
    errors: list[DefinitionError] = []
    if declaration.required and declaration.default is not None:
        errors.append(
            DefinitionSchemaError(
                "a parameter with a default is never missing; drop required or the default",
                path=f"{where}.required",
            )
        )
    errors.extend(
        DefinitionSchemaError(message, path=f"{where}{at}")
        for at, message in _schema_problems(value_schema(declaration), depth=0)
    )
    if errors:
        return errors
    schema = value_schema(declaration)
    for position, value in enumerate(declaration.enum or ()):
        without_enum = {key: item for key, item in schema.items() if key != "enum"}
        errors.extend(
            DefinitionSchemaError(message, path=path)
            for path, message in _value_errors(
                without_enum, _normalised(value), path=f"{where}.enum[{position}]"
            )
        )
    if declaration.default is not None:
        errors.extend(
            DefinitionSchemaError(message, path=path)
            for path, message in _value_errors(
                schema, _normalised(declaration.default), path=f"{where}.default"
            )
        )
    return errors


def _schema_problems(schema: Mapping[str, Any], *, depth: int) -> list[tuple[str, str]]:
    """(path suffix, message) for every way a value schema departs from the subset."""
    problems: list[tuple[str, str]] = []
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in _KEYWORDS:
        return [(".type", f"must be one of {', '.join(_KEYWORDS)}")]
    for keyword, value in schema.items():
        if keyword in ("type", "description"):
            continue
        if keyword not in _KEYWORDS[kind]:
            problems.append((f".{keyword}", f"{keyword} does not apply to type {kind}"))
        elif keyword == "pattern":
            problems.extend(_pattern_problem(value))
        elif keyword in ("minimum", "maximum") and not _is_number(value):
            problems.append((f".{keyword}", "must be a number"))
        elif keyword in ("minItems", "maxItems", "minLength", "maxLength") and not (
            type(value) is int and value >= 0
        ):
            problems.append((f".{keyword}", "must be an integer >= 0"))
        elif keyword == "enum" and not (isinstance(value, list | tuple) and value):
            problems.append((".enum", "must be a non-empty list"))
        elif keyword == "items":
            if not isinstance(value, Mapping):
                problems.append((".items", "must be an object (a JSON Schema)"))
            elif depth + 1 >= MAX_ITEMS_DEPTH:
                problems.append((".items", f"items nest at most {MAX_ITEMS_DEPTH} levels"))
            else:
                problems.extend(
                    (f".items{at}", message)
                    for at, message in _schema_problems(value, depth=depth + 1)
                )
    for low, high in (("minimum", "maximum"), ("minItems", "maxItems")):
        if (
            _is_number(schema.get(low))
            and _is_number(schema.get(high))
            and schema[low] > schema[high]
        ):
            problems.append((f".{low}", f"is greater than {high}"))
    return problems


def _pattern_problem(pattern: Any) -> list[tuple[str, str]]:
    import re

    if not isinstance(pattern, str):
        return [(".pattern", "must be a string")]
    try:
        go_compatible_pattern(pattern)
    except re.error as error:
        return [(".pattern", f"is not a valid regular expression: {error}")]
    return []


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def effective_parameters(definition: DefinitionSpec, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters a run of ``definition`` records for ``raw`` (its ``spec.parameters``):
    checked against the declarations, defaults filled in; ParameterError naming each
    ``spec.parameters.<name>`` that does not fit. Without declarations the values must be
    strings, as they always were, and are returned as they are."""
    errors: list[tuple[str, str]] = []
    if not definition.parameters:
        for name in sorted(raw):
            if not isinstance(raw[name], str):
                errors.append(
                    (
                        parameter_path(name),
                        f"must be a string (workflow {definition.workflow!r} version "
                        f"{definition.version} declares no typed spec.parameters), not "
                        f"{json_type(raw[name])}",
                    )
                )
        if errors:
            raise ParameterError(errors)
        return dict(raw)
    declared = {declaration.name: declaration for declaration in definition.parameters}
    for name in sorted(set(raw) - set(declared)):
        known = ", ".join(sorted(declared))
        errors.append((parameter_path(name), f"unknown parameter (declared: {known})"))
    values: dict[str, Any] = {}
    for name, declaration in declared.items():
        if name in raw:
            value = _normalised(raw[name])
            errors.extend(
                _value_errors(value_schema(declaration), value, path=parameter_path(name))
            )
            values[name] = value
        elif declaration.default is not None:
            values[name] = _normalised(declaration.default)
        elif declaration.required:
            errors.append((parameter_path(name), f"required parameter of type {declaration.type}"))
    if errors:
        raise ParameterError(sorted(errors))
    return values


def sample_values(definition: DefinitionSpec) -> list[dict[str, Any]]:
    """Typed witnesses of the declared parameters, used to type-check expressions offline:
    each declared parameter with its default (or a typical value of its type), then with a
    second value of the same type."""
    first: dict[str, Any] = {}
    second: dict[str, Any] = {}
    for declaration in definition.parameters:
        typical = _typical(value_schema(declaration))
        first[declaration.name] = (
            _normalised(declaration.default) if declaration.default is not None else typical[0]
        )
        second[declaration.name] = typical[-1]
    return [first, second]


def _typical(schema: Mapping[str, Any]) -> list[Any]:
    """Values of the schema's type: its enum's, its bounds, or plain ones."""
    if schema.get("enum"):
        return [_normalised(value) for value in schema["enum"]]
    kind = schema["type"]
    if kind == "string":
        return ["", "x"]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("maximum", 0))
        value = int(low) if kind == "integer" else float(low)
        return [value, value]
    if kind == "boolean":
        return [False, True]
    if kind == "array":
        items = schema.get("items")
        return [[], [_typical(items)[-1]] if isinstance(items, Mapping) else []]
    return [{}, {}]
