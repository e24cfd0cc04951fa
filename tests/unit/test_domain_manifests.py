"""YAML is read as Kubernetes reads it (sigs.k8s.io/yaml over go-yaml v2)."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.errors import ManifestError
from flowforge.domain.manifests import load_documents, read_documents, resolve_plain_scalar


def value_of(text: str) -> Any:
    return load_documents(f"v: {text}\n", source="t.yaml")[0]["v"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30", "2026-11-30"),  # an unquoted date stays a string
        ("2001-12-14t21:59:43.10-05:00", "2001-12-14t21:59:43.10-05:00"),
        ("yes", True),
        ("No", False),
        ("on", True),
        ("OFF", False),
        ("y", True),
        ("n", False),
        ("true", True),
        ("yEs", "yEs"),
        ("~", None),
        ("null", None),
        ("", None),
        ("0x1F", 31),
        ("0o17", 15),
        ("017", 15),
        ("1_000", 1000),
        ("-5", -5),
        ("+5", 5),
        ("08", 8),
        ("1e3", 1000),
        ("1.0", 1),
        ("1.5", 1.5),
        (".5", 0.5),
        ("1:30", "1:30"),  # sexagesimal is a YAML 1.1 int in PyYAML, a string in go-yaml
        ("1e400", "1e400"),  # float overflow is an error in Go, so the scalar stays a string
        ("99999999999999999999", 100000000000000000000),
        ('"yes"', "yes"),
        ("'12'", "12"),
        ("!!str 12", "12"),
        ("!!float 2", 2),
    ],
)
def test_plain_scalars_resolve_as_go_yaml_v2_resolves_them(text: str, expected: Any) -> None:
    value = value_of(text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("text", [".inf", "-.Inf", ".nan", "!!float .inf"])
def test_values_json_cannot_carry_are_errors(text: str) -> None:
    with pytest.raises(ManifestError, match=r"t\.yaml:1: .* JSON"):
        load_documents(f"v: {text}\n", source="t.yaml")


def test_non_string_keys_are_stringified() -> None:
    document = load_documents("1: a\nyes: b\n1.5: c\nfalse: d\n", source="t.yaml")[0]
    assert document == {"1": "a", "true": "b", "1.5": "c", "false": "d"}


def test_a_null_key_is_an_error() -> None:
    with pytest.raises(ManifestError, match="unsupported map key"):
        load_documents("~: a\n", source="t.yaml")


def test_a_key_given_twice_is_an_error_naming_the_line() -> None:
    with pytest.raises(ManifestError) as raised:
        load_documents("a: 1\nb:\n  c: 1\n  c: 2\n", source="t.yaml")
    assert raised.value.line == 4
    assert str(raised.value).startswith("t.yaml:4:")


def test_merge_keys_and_anchors_work_and_explicit_keys_win() -> None:
    text = "base: &b {p: 1, q: 2}\nm:\n  <<: *b\n  q: 3\n"
    assert load_documents(text, source="t.yaml")[0]["m"] == {"p": 1, "q": 3}


def test_several_documents_empty_ones_skipped_with_positions() -> None:
    text = "a: 1\n---\n---\n# only a comment\n---\nb: 2\n"
    documents = read_documents(text, source="t.yaml")
    assert [(document.index, document.body) for document in documents] == [
        (0, {"a": 1}),
        (3, {"b": 2}),
    ]
    assert documents[1].line == 6


def test_a_parse_error_names_source_and_line() -> None:
    with pytest.raises(ManifestError) as raised:
        load_documents("a: 1\nb: [1, 2\nc: 3\n", source="bad.yaml")
    assert raised.value.source == "bad.yaml"
    assert raised.value.line is not None and raised.value.line >= 2
    assert str(raised.value).startswith(f"bad.yaml:{raised.value.line}: ")


def test_a_document_that_is_not_a_mapping_is_an_error() -> None:
    with pytest.raises(ManifestError, match="not a mapping"):
        load_documents("a: 1\n---\n- 1\n", source="t.yaml")


def test_json_is_read_too() -> None:
    assert load_documents('{"kind": "X", "n": 1.0}', source="t.json") == [{"kind": "X", "n": 1}]


def test_resolve_plain_scalar_keeps_unknown_words() -> None:
    assert resolve_plain_scalar("extract") == "extract"
    assert resolve_plain_scalar("Infinity") == "Infinity"
