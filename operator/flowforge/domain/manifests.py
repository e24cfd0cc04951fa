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
  is an error, and so is a key given twice in one mapping; tags on mappings and sequences are
  ignored, and an alias inside the value it names is an error, as in go-yaml v2.

The values are built straight from the parser's events (libyaml's C parser when PyYAML has it,
else PyYAML's own), not through PyYAML's node graph and constructor: on a 10,000-task file that
path cost several times the parse itself.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    NodeEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)

from flowforge.domain.errors import ManifestError

__all__ = [
    "PARSERS",
    "ManifestDocument",
    "ManifestError",
    "Parser",
    "load_documents",
    "read_documents",
]

_YAML_TAG = "tag:yaml.org,2002:"
_MERGE_KEY = "<<"
_MAX_NESTING = 1000  # libyaml's own limit: the pure-Python parser must refuse what it refuses

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


Parser = Callable[[str], Any]
"""Makes a PyYAML event parser (``get_event``, ``dispose``) over a text."""

PARSERS: dict[str, Parser] = {"python": yaml.BaseLoader}
if yaml.__with_libyaml__:
    PARSERS["libyaml"] = yaml.CBaseLoader
DEFAULT_PARSER: Parser = PARSERS.get("libyaml", yaml.BaseLoader)


class _DecodeError(Exception):
    def __init__(self, message: str, event: Event) -> None:
        super().__init__(message)
        self.message = message
        self.line = None if event.start_mark is None else event.start_mark.line + 1


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


def _json_value(value: Any, event: ScalarEvent) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _DecodeError(f"{event.value} is not a number JSON can carry", event)
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


def _key_string(key: Any, event: Event) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return _go_float_key(key)
    raise _DecodeError(
        f"unsupported map key {key!r}: keys must be strings, numbers or booleans", event
    )


_SCALAR_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "null": (type(None),),
}


def _tagged_scalar(tag: str, event: ScalarEvent) -> Any:
    """The value of a scalar with an explicit tag; go-yaml v2 uses the tag only to resolve it."""
    name = tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else ""
    if name == "binary":
        try:
            return base64.b64decode(event.value).decode("utf-8", "replace")
        except ValueError as exc:
            raise _DecodeError(f"invalid !!binary value: {exc}", event) from exc
    expected = _SCALAR_TYPES.get(name)
    if expected is None:  # !!str, !!timestamp, local and unknown tags: the text itself
        return event.value
    value = resolve_plain_scalar(event.value)
    if type(value) not in expected:
        raise _DecodeError(f"cannot decode {event.value!r} as !!{name}", event)
    return _json_value(float(value) if name == "float" else value, event)


def _kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return "mapping"
    return "sequence" if isinstance(value, list) else "scalar"


class _OpenCollection:
    """A mapping or sequence whose end event has not come yet."""

    __slots__ = ("anchor", "key", "key_event", "mapping", "merges", "start", "value")

    def __init__(self, value: dict[str, Any] | list[Any], start: NodeEvent) -> None:
        self.value = value
        self.mapping = isinstance(value, dict)
        self.start = start
        self.anchor = start.anchor
        self.key: Any = _NO_KEY
        self.key_event: Event = start
        self.merges: list[dict[str, Any]] = []

    def add_merge(self, value: Any, event: Event) -> None:
        """``<<: value``: a mapping, or a list of mappings of which the first wins."""
        if isinstance(value, dict):
            self.merges.append(value)
            return
        if not isinstance(value, list):
            raise _DecodeError(
                f"expected a mapping or list of mappings for merging, but found {_kind_of(value)}",
                event,
            )
        for item in reversed(value):
            if not isinstance(item, dict):
                raise _DecodeError(
                    f"expected a mapping for merging, but found {_kind_of(item)}", event
                )
            self.merges.append(item)

    def close(self) -> dict[str, Any] | list[Any]:
        """The finished value: merged keys first, the mapping's own keys winning over them."""
        if self.merges and isinstance(self.value, dict):
            own = dict(self.value)
            self.value.clear()
            for merged in self.merges:
                self.value.update(merged)
            self.value.update(own)
        return self.value


_NO_KEY: Any = object()
_MERGE: Any = object()


def _scalar_value(event: ScalarEvent, *, key_position: bool) -> Any:
    tag = event.tag
    if tag is not None and tag != "!":
        return _tagged_scalar(tag, event)
    text = event.value
    if not event.implicit[0]:
        return text
    if text == _MERGE_KEY and key_position:
        return _MERGE
    return _json_value(resolve_plain_scalar(text), event)


# a plain scalar starting otherwise, and not a word of _RESOLVE_MAP, is its own text
_RESOLVED_STARTS = frozenset("+-.0123456789<")


def _values(parser: Any) -> list[tuple[int, Any]]:
    """The first line and the value of every document of the stream, from its events."""
    get_event = parser.get_event
    documents: list[tuple[int, Any]] = []
    stack: list[_OpenCollection] = []
    top: _OpenCollection | None = None  # stack[-1], kept apart: this loop is the hot path
    anchors: dict[str, Any] = {}
    open_anchors: set[str] = set()
    while True:
        event = get_event()
        kind = type(event)
        if kind is ScalarEvent:
            text = event.value
            if (
                event.tag is None
                and event.implicit[0]
                and text
                and text[0] not in _RESOLVED_STARTS
                and text not in _RESOLVE_MAP
            ):
                value = text
            else:
                value = _scalar_value(
                    event, key_position=top is not None and top.mapping and top.key is _NO_KEY
                )
            if event.anchor is not None:
                anchors[event.anchor] = value
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            if len(stack) >= _MAX_NESTING:
                raise _DecodeError("exceeded maximum nesting depth", event)
            top = _OpenCollection({} if kind is MappingStartEvent else [], event)
            if event.anchor is not None:
                anchors[event.anchor] = top.value
                open_anchors.add(event.anchor)
            stack.append(top)
            continue
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            closed = stack.pop()
            top = stack[-1] if stack else None
            value = closed.close()
            event = closed.start
            if closed.anchor is not None:
                open_anchors.discard(closed.anchor)
        elif kind is AliasEvent:
            anchor = event.anchor
            if anchor in open_anchors:
                raise _DecodeError(f"anchor '{anchor}' value contains itself", event)
            if anchor not in anchors:
                raise _DecodeError(f"found undefined alias '{anchor}'", event)
            value = anchors[anchor]
        elif kind is DocumentStartEvent:
            anchors, open_anchors = {}, set()
            continue
        elif kind is StreamEndEvent:
            return documents
        else:  # the stream's start, a document's end
            continue
        if top is None:
            documents.append((event.start_mark.line + 1, value))
        elif not top.mapping:
            top.value.append(value)  # type: ignore[union-attr]
        elif top.key is _NO_KEY:
            top.key = value if type(value) is str or value is _MERGE else _key_string(value, event)
            top.key_event = event
        else:
            key, top.key = top.key, _NO_KEY
            if key is _MERGE:
                top.add_merge(value, event)
            elif key in top.value:
                raise _DecodeError(f'mapping key "{key}" is given twice', top.key_event)
            else:
                top.value[key] = value


def _finish_document(parser: Any) -> None:
    """Read the rest of the current document, so that a syntax error in it surfaces."""
    while not isinstance(parser.get_event(), DocumentEndEvent | StreamEndEvent):
        pass


def read_documents(
    text: str, *, source: str, parser: Parser = DEFAULT_PARSER
) -> list[ManifestDocument]:
    """Every non-empty document of a (multi-document) YAML or JSON stream, with positions."""
    events = parser(text)
    try:
        try:
            values = _values(events)
        except _DecodeError:
            _finish_document(events)  # go-yaml parses a whole document before decoding it
            raise
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
    finally:
        events.dispose()
    documents: list[ManifestDocument] = []
    for index, (line, body) in enumerate(values):
        if isinstance(body, dict):
            documents.append(ManifestDocument(index=index, line=line, body=body))
        elif body is not None:
            raise ManifestError(
                f"document {index} is not a mapping (an object with apiVersion and kind)",
                source=source,
                line=line,
            )
    return documents


def load_documents(text: str, *, source: str) -> list[dict[str, Any]]:
    """The non-empty documents of a manifest stream, as the JSON objects Kubernetes sees."""
    return [document.body for document in read_documents(text, source=source)]
