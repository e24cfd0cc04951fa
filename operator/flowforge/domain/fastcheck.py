"""A conservative, compiled validity check for the subset of JSON Schema the spec uses.

``jsonschema`` reports every error with its path but spends microseconds per keyword; on a
10,000-task definition that is most of a second. This module turns the schema, once, into
straight-line Python source (one function per object or array schema) that answers only
"certainly valid?". A ``True`` is as good as jsonschema's verdict (tests compare the two); a
``False`` may be pessimistic (an integral float, say) and sends the caller to jsonschema for
the real errors. A keyword it does not understand is a compile error, so the schema cannot
grow a rule this check silently skips.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"$schema", "description", "title", "default", "examples"})
_SCALAR_KEYWORDS = frozenset(
    {"type", "minLength", "maxLength", "pattern", "minimum", "maximum", "enum", "anyOf"}
)


def go_compatible_pattern(pattern: str) -> re.Pattern[str]:
    """Compile an ECMA/RE2-style pattern so that a final ``$`` means the end of the text.

    Python's ``$`` also matches before a trailing newline, which Kubernetes (Go regexp) does
    not; ``"etl\\n"`` must not pass as a DNS-1123 label here and fail in the cluster.
    """
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


class _Compiler:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self.counter = 0

    def constant(self, value: Any) -> str:
        name = f"c{len(self.constants)}"
        self.constants[name] = value
        return name

    def function(self, schema: Mapping[str, Any]) -> str:
        """Emit ``def fN(v) -> bool`` for ``schema`` and return its name."""
        self.counter += 1
        name = f"f{self.counter}"
        body: list[str] = []
        expression = self.expression(schema, "v", body, depth=0)
        self.lines.append(f"def {name}(v):")
        self.lines.extend(f"    {line}" for line in body)
        self.lines.append(f"    return {expression}")
        return name

    def expression(
        self, schema: Mapping[str, Any], value: str, body: list[str], *, depth: int
    ) -> str:
        """A boolean expression for ``schema``; statements it needs go into ``body`` first."""
        keywords = {
            keyword: argument
            for keyword, argument in schema.items()
            if keyword not in _ANNOTATIONS and not keyword.startswith("x-kubernetes-")
        }
        unknown = set(keywords) - _SCALAR_KEYWORDS - _OBJECT_KEYWORDS - _ARRAY_KEYWORDS
        if unknown:
            raise ValueError(f"fastcheck cannot compile the JSON Schema keywords {sorted(unknown)}")
        kind = keywords.get("type")
        if kind == "object":
            self.object_statements(keywords, value, body, depth=depth)
            return "True"
        if kind == "array":
            self.array_statements(keywords, value, body, depth=depth)
            return "True"
        if set(keywords) & (_OBJECT_KEYWORDS | _ARRAY_KEYWORDS) - {"type"}:
            raise ValueError("fastcheck needs an explicit type on object and array schemas")
        return self.scalar_expression(keywords, value)

    def scalar_expression(self, keywords: Mapping[str, Any], value: str) -> str:
        parts: list[str] = []
        kind = keywords.get("type")
        if kind == "string":
            parts.append(f"type({value}) is str")
        elif kind == "integer":
            parts.append(f"type({value}) is int")  # bool and integral floats: ask jsonschema
        elif kind == "boolean":
            parts.append(f"type({value}) is bool")
        elif kind is not None:
            raise ValueError(f"fastcheck cannot compile type {kind!r}")
        if "minLength" in keywords or "maxLength" in keywords:
            if kind != "string":
                raise ValueError("fastcheck needs type string with minLength/maxLength")
            low, high = keywords.get("minLength", 0), keywords.get("maxLength")
            parts.append(f"{low} <= len({value})" + (f" <= {high}" if high is not None else ""))
        if "minimum" in keywords or "maximum" in keywords:
            if kind != "integer":
                raise ValueError("fastcheck needs type integer with minimum/maximum")
            if "minimum" in keywords:
                parts.append(f"{value} >= {keywords['minimum']!r}")
            if "maximum" in keywords:
                parts.append(f"{value} <= {keywords['maximum']!r}")
        if "pattern" in keywords:
            if kind != "string":
                raise ValueError("fastcheck needs type string with pattern")
            search = self.constant(go_compatible_pattern(keywords["pattern"]).search)
            parts.append(f"{search}({value}) is not None")
        if "enum" in keywords:
            if not all(type(item) is str for item in keywords["enum"]):
                raise ValueError("fastcheck only compiles enums of strings")
            allowed = self.constant(frozenset(keywords["enum"]))
            parts.append(f"type({value}) is str and {value} in {allowed}")
        if "anyOf" in keywords:
            alternatives = [self.function(alternative) for alternative in keywords["anyOf"]]
            parts.append("(" + " or ".join(f"{name}({value})" for name in alternatives) + ")")
        return "(" + " and ".join(parts or ["True"]) + ")"

    def object_statements(
        self, keywords: Mapping[str, Any], value: str, body: list[str], *, depth: int
    ) -> None:
        body.append(f"if type({value}) is not dict: return False")
        for name in keywords.get("required", ()):
            body.append(f"if {name!r} not in {value}: return False")
        if "maxProperties" in keywords:
            body.append(f"if len({value}) > {keywords['maxProperties']}: return False")
        if "minProperties" in keywords:
            body.append(f"if len({value}) < {keywords['minProperties']}: return False")
        properties: Mapping[str, Any] = keywords.get("properties", {})
        declared = self.constant(frozenset(properties))
        extra = keywords.get("additionalProperties", True)
        if extra is False:
            body.append(f"if not {declared}.issuperset({value}): return False")
        for name, subschema in properties.items():
            item = f"p{depth}"
            nested: list[str] = []
            check = self.expression(subschema, item, nested, depth=depth + 1)
            body.append(f"{item} = {value}.get({name!r}, MISSING)")
            body.append(f"if {item} is not MISSING:")
            body.extend(f"    {line}" for line in nested)
            if check != "True":
                body.append(f"    if not {check}: return False")
        if isinstance(extra, Mapping):
            function = self.function(extra)
            key, item = f"k{depth}", f"x{depth}"
            body.append(f"for {key}, {item} in {value}.items():")
            body.append(f"    if {key} not in {declared} and not {function}({item}): return False")
        elif extra is not True and extra is not False:
            raise ValueError("fastcheck cannot compile this additionalProperties")

    def array_statements(
        self, keywords: Mapping[str, Any], value: str, body: list[str], *, depth: int
    ) -> None:
        body.append(f"if type({value}) is not list: return False")
        if "minItems" in keywords:
            body.append(f"if len({value}) < {keywords['minItems']}: return False")
        if "maxItems" in keywords:
            body.append(f"if len({value}) > {keywords['maxItems']}: return False")
        items = keywords.get("items", {})
        if items.get("type") == "string" and set(items) <= _STRING_ITEM_KEYWORDS:
            # the common array of names: checked in C loops (map) instead of one item at a time
            body.append(f"if not STR_ONLY.issuperset(map(type, {value})): return False")
            low, high = items.get("minLength", 0), items.get("maxLength")
            if low or high is not None:
                lengths = f"map(len, {value})"
                body.append(f"if {value} and min({lengths}) < {low}: return False")
                if high is not None:
                    body.append(f"if {value} and max({lengths}) > {high}: return False")
            if "pattern" in items:
                search = self.constant(go_compatible_pattern(items["pattern"]).search)
                body.append(f"if not all(map({search}, {value})): return False")
        elif "items" in keywords:
            item = f"i{depth}"
            nested: list[str] = []
            check = self.expression(keywords["items"], item, nested, depth=depth + 1)
            if nested:  # an object or array item: a function per item keeps the loop simple
                function = self.function(keywords["items"])
                check = f"{function}({item})"
            body.append(f"for {item} in {value}:")
            body.append(f"    if not {check}: return False")
        if keywords.get("uniqueItems"):
            # every item is a string here (or the check already failed): set semantics hold
            if keywords.get("items", {}).get("type") != "string":
                raise ValueError("fastcheck compiles uniqueItems only for arrays of strings")
            body.append(f"if len(set({value})) != len({value}): return False")


_OBJECT_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "maxProperties", "minProperties"}
)
_ARRAY_KEYWORDS = frozenset({"type", "items", "minItems", "maxItems", "uniqueItems"})
_STRING_ITEM_KEYWORDS = _ANNOTATIONS | {"type", "minLength", "maxLength", "pattern"}


def compile_source(schema: Mapping[str, Any]) -> tuple[str, dict[str, Any], str]:
    """The generated source, its constants, and the name of the entry function."""
    compiler = _Compiler()
    entry = compiler.function(schema)
    return "\n".join(compiler.lines) + "\n", compiler.constants, entry


def compile_check(schema: Mapping[str, Any]) -> Check:
    """Compile ``schema`` into a predicate that is ``True`` only for valid instances."""
    source, constants, entry = compile_source(schema)
    namespace: dict[str, Any] = {**constants, "MISSING": object(), "STR_ONLY": frozenset({str})}
    exec(compile(source, "<flowforge.domain.fastcheck>", "exec"), namespace)
    check: Check = namespace[entry]
    return check
