"""Reading manifests the way ``kubectl`` and the Kubernetes API server read them.

Kubernetes turns YAML into JSON with sigs.k8s.io/yaml over go-yaml v2, and the verdict of
``flowforge validate`` must be the cluster's, so the values here are the ones that JSON holds:

* plain scalars resolve as go-yaml v2 resolves them: YAML 1.1 booleans (``yes``, ``no``,
  ``on``, ``off``, ``y``, ``n``...), Go integer syntax (``0x1f``, ``0o17``, ``017``, ``1_000``),
  floats such as ``1e3``; unquoted dates and timestamps stay strings, and so do sexagesimal
  numbers such as ``1:30`` (PyYAML would turn each of these into something else);
* numbers JSON writes as integers (``2.0``) are integers; ``.inf`` and ``.nan`` are errors,
  because JSON cannot carry them;
* non-string mapping keys are stringified (``1`` -> ``"1"``, ``yes`` -> ``"true"``), a null key
  is an error, and so is a key given twice in one mapping.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from flowforge.domain.errors import ManifestError

__all__ = ["ManifestDocument", "ManifestError", "load_documents", "read_documents"]

_PLAIN_TAG = "tag:flowforge.io,2026:plain"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_YAML_TAG = "tag:yaml.org,2002:"

_RESOLVE_MAP: dict[str, Any] = {
    **dict.fromkeys(
        ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True
    ),
    **dict.fromkeys(
        ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False
    ),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z")
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?\Z")
_GO_INT = re.compile(
    r"(?P<sign>[-+]?)(?:0[xX](?P<hex>[0-9a-fA-F]+)|0[oO](?P<oct>[0-7]+)|0[bB](?P<bin>[01]+)"
    r"|0(?P<old_oct>[0-7]+)|(?P<dec>0|[1-9][0-9]*))\Z"
)
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_JSON_EXACT_INTEGER_LIMIT = 1e21  # Go's encoding/json writes integral floats below this as 123


@dataclass(frozen=True, slots=True)
class ManifestDocument:
    """One non-empty document of a manifest stream; ``index`` counts every document from 0."""

    index: int
    line: int
    body: dict[str, Any]


class _DecodeError(Exception):
    def __init__(self, message: str, node: Node) -> None:
        super().__init__(message)
        self.message = message
        self.line = node.start_mark.line + 1


def _go_parse_int(text: str) -> int | None:
    match = _GO_INT.match(text)
    if match is None:
        return None
    for group, base in (("hex", 16), ("oct", 8), ("bin", 2), ("old_oct", 8), ("dec", 10)):
        digits = match.group(group)
        if digits is not None:
            value = int(digits, base)
            break
    if match.group("sign") == "-":
        value = -value
    if _INT64_MIN <= value <= _INT64_MAX:
        return value
    if match.group("sign") == "" and value <= _UINT64_MAX:
        return value
    return None


def _go_parse_float(text: str) -> float | None:
    value = float(text)
    return None if math.isinf(value) else value  # Go reports overflow as an error


def resolve_plain_scalar(text: str) -> Any:
    """The value go-yaml v2 gives an unquoted scalar when decoding into ``interface{}``."""
    if text in _RESOLVE_MAP:
        return _RESOLVE_MAP[text]
    first = text[0]
    if first == ".":
        return _go_parse_float(text) if _DOT_FLOAT.match(text) else text
    if first in "+-0123456789":
        plain = text.replace("_", "")
        integer = _go_parse_int(plain)
        if integer is not None:
            return integer
        if _YAML_STYLE_FLOAT.match(plain):
            number = _go_parse_float(plain)
            if number is not None:
                return number
    return text


def _json_value(value: Any, node: Node) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _DecodeError(f"{node.value} is not a number JSON can carry", node)
        if value.is_integer() and abs(value) < _JSON_EXACT_INTEGER_LIMIT:
            return int(value)
    return value


def _go_float_key(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 32), as sigs.k8s.io/yaml stringifies float keys."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    single = struct.unpack("f", struct.pack("f", value))[0]
    if single == 0:
        return "-0" if math.copysign(1, single) < 0 else "0"
    for precision in range(1, 10):
        candidate = f"{single:.{precision - 1}e}"
        if struct.unpack("f", struct.pack("f", float(candidate)))[0] == single:
            break
    sign, digits, exponent = Decimal(candidate).normalize().as_tuple()
    text_digits = "".join(map(str, digits))
    assert isinstance(exponent, int)
    point = len(text_digits) + exponent  # digits before the decimal point
    prefix = "-" if sign else ""
    if point - 1 < -4 or point - 1 >= 6:
        mantissa = text_digits[0] + ("." + text_digits[1:] if len(text_digits) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if point - 1 < 0 else '+'}{abs(point - 1):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{text_digits}"
    if point >= len(text_digits):
        return prefix + text_digits + "0" * (point - len(text_digits))
    return f"{prefix}{text_digits[:point]}.{text_digits[point:]}"


def _key_string(key: Any, node: Node) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return _go_float_key(key)
    raise _DecodeError(
        f"unsupported map key {key!r}: keys must be strings, numbers or booleans", node
    )


_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _KubernetesLoader(_BaseLoader):  # type: ignore[misc]
    def resolve(self, kind: type[Node], value: str, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode and implicit[0]:
            return _MERGE_TAG if value == "<<" else _PLAIN_TAG
        return str(super().resolve(kind, value, implicit))

    def construct_plain(self, node: ScalarNode) -> Any:
        return _json_value(resolve_plain_scalar(node.value), node)

    def construct_tagged_scalar(self, node: ScalarNode) -> Any:
        tag = node.tag[len(_YAML_TAG) :] if node.tag.startswith(_YAML_TAG) else ""
        if tag in ("str", "timestamp") or not tag:
            return node.value
        if tag == "binary":
            try:
                return base64.b64decode(node.value).decode("utf-8", "replace")
            except ValueError as exc:
                raise _DecodeError(f"invalid !!binary value: {exc}", node) from exc
        value = resolve_plain_scalar(node.value)
        expected = {"int": (int,), "float": (int, float), "bool": (bool,), "null": (type(None),)}
        if tag not in expected:
            raise _DecodeError(f"unsupported tag !!{tag}", node)
        if type(value) not in expected[tag]:
            raise _DecodeError(f"cannot decode {node.value!r} as !!{tag}", node)
        return _json_value(float(value) if tag == "float" else value, node)

    def construct_map(self, node: MappingNode) -> Iterator[dict[str, Any]]:
        data: dict[str, Any] = {}
        yield data
        explicit = [pair for pair in node.value if pair[0].tag != _MERGE_TAG]
        self.flatten_mapping(node)
        merged = node.value[: len(node.value) - len(explicit)]
        for key_node, value_node in merged:
            key = _key_string(self.construct_object(key_node), key_node)
            data[key] = self.construct_object(value_node)
        seen: set[str] = set()
        for key_node, value_node in explicit:
            key = _key_string(self.construct_object(key_node), key_node)
            if key in seen:
                raise _DecodeError(f'mapping key "{key}" is given twice', key_node)
            seen.add(key)
            data[key] = self.construct_object(value_node)

    def construct_other(self, tag_suffix: str, node: Node) -> Any:
        if isinstance(node, ScalarNode):
            return node.value
        if isinstance(node, MappingNode):
            return self.construct_map(node)
        return self.construct_yaml_seq(node)


_KubernetesLoader.add_constructor(_PLAIN_TAG, _KubernetesLoader.construct_plain)
for _scalar_tag in ("str", "int", "float", "bool", "null", "timestamp", "binary"):
    _KubernetesLoader.add_constructor(
        _YAML_TAG + _scalar_tag, _KubernetesLoader.construct_tagged_scalar
    )
_KubernetesLoader.add_constructor(_YAML_TAG + "map", _KubernetesLoader.construct_map)
_KubernetesLoader.add_multi_constructor("!", _KubernetesLoader.construct_other)
_KubernetesLoader.add_multi_constructor(_YAML_TAG, _KubernetesLoader.construct_other)


def read_documents(text: str, *, source: str) -> list[ManifestDocument]:
    """Every non-empty document of a (multi-document) YAML or JSON stream, with positions."""
    loader = _KubernetesLoader(text)
    documents: list[ManifestDocument] = []
    index = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                body = loader.construct_document(node)
                line = node.start_mark.line + 1
                if isinstance(body, dict):
                    documents.append(ManifestDocument(index=index, line=line, body=body))
                elif body is not None:
                    raise ManifestError(
                        f"document {index} is not a mapping (an object with apiVersion and kind)",
                        source=source,
                        line=line,
                    )
            index += 1
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise ManifestError(
            problem, source=source, line=None if mark is None else mark.line + 1
        ) from exc
    except yaml.YAMLError as exc:
        raise ManifestError(str(exc).splitlines()[0], source=source) from exc
    except _DecodeError as exc:
        raise ManifestError(exc.message, source=source, line=exc.line) from exc
    except RecursionError as exc:
        raise ManifestError("nested too deeply", source=source) from exc
    finally:
        loader.dispose()
    return documents


def load_documents(text: str, *, source: str) -> list[dict[str, Any]]:
    """The non-empty documents of a manifest stream, as the JSON objects Kubernetes sees."""
    return [document.body for document in read_documents(text, source=source)]
