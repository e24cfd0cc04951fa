"""The manifest reader builds values from parser events: libyaml's and PyYAML's agree, and the
corners go-yaml v2 decides (merges, aliases, tags, nesting) are decided as it decides them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flowforge.domain.errors import ManifestError
from flowforge.domain.manifests import PARSERS, Parser, read_documents

REPOSITORY = Path(__file__).parents[2]


@pytest.fixture(params=sorted(PARSERS))
def parser(request: pytest.FixtureRequest) -> Parser:
    return PARSERS[request.param]


def load(text: str, parser: Parser) -> list[dict[str, Any]]:
    return [document.body for document in read_documents(text, source="t.yaml", parser=parser)]


def test_pyyaml_here_has_libyaml_so_the_fast_parser_is_the_default() -> None:
    assert yaml.__with_libyaml__ and set(PARSERS) == {"libyaml", "python"}


@pytest.mark.parametrize(
    "path", sorted((REPOSITORY / "examples").glob("*.yaml")), ids=lambda path: path.name
)
def test_both_parsers_read_the_examples_alike(path: Path) -> None:
    text = path.read_text()
    read = {name: load(text, parser) for name, parser in PARSERS.items()}
    assert read["libyaml"] == read["python"] and read["python"]


def test_merges_take_the_first_of_a_list_and_the_mapping_s_own_keys_win(parser: Parser) -> None:
    text = (
        "a: &a {p: 1, q: 1}\n"
        "b: &b {p: 2, r: 2}\n"
        "listed: {<<: [*a, *b], s: 0}\n"
        "twice: {k: 1, <<: *a, <<: *b, q: 9}\n"
    )
    body = load(text, parser)[0]
    assert body["listed"] == {"p": 1, "r": 2, "q": 1, "s": 0}
    assert list(body["twice"]) == ["p", "q", "r", "k"]  # merged keys come first
    assert body["twice"] == {"p": 2, "q": 9, "r": 2, "k": 1}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: {<<: 5}\n", "expected a mapping or list of mappings for merging, but found scalar"),
        (
            "a: &a {x: 1}\nb: {<<: [*a, [1]]}\n",
            "expected a mapping for merging, but found sequence",
        ),
        ("a: {<<: {x: 1, x: 2}}\n", 'mapping key "x" is given twice'),
    ],
)
def test_what_cannot_be_merged_is_an_error(text: str, message: str, parser: Parser) -> None:
    with pytest.raises(ManifestError, match=message):
        load(text, parser)


def test_a_merge_key_that_is_quoted_or_a_value_is_a_plain_string(parser: Parser) -> None:
    assert load("'<<': 1\nk: <<\n", parser) == [{"<<": 1, "k": "<<"}]


def test_an_alias_inside_the_value_it_names_is_an_error(parser: Parser) -> None:
    with pytest.raises(ManifestError, match="anchor 'r' value contains itself"):
        load("a: &r [1, *r]\n", parser)


def test_an_undefined_alias_is_an_error_naming_it(parser: Parser) -> None:
    with pytest.raises(ManifestError, match="found undefined alias 'nope'") as raised:
        load("a: 1\nb: *nope\n", parser)
    assert raised.value.line == 2


def test_an_anchor_defined_again_names_the_newer_value_and_anchors_end_with_a_document(
    parser: Parser,
) -> None:
    assert load("p: &a 1\nq: *a\nr: &a 2\ns: *a\n", parser) == [{"p": 1, "q": 1, "r": 2, "s": 2}]
    with pytest.raises(ManifestError, match="undefined alias 'a'"):
        load("x: &a 1\n---\ny: *a\n", parser)


def test_tags_on_collections_are_ignored_and_unknown_scalar_tags_keep_the_text(
    parser: Parser,
) -> None:
    text = (
        "set: !!set {x, y}\n"
        "omap: !!omap [{a: 1}]\n"
        "local: !thing {a: [1]}\n"
        "uri: !<tag:example.com,2000:x> text\n"
        "map: !!map {b: 2}\n"
    )
    assert load(text, parser) == [
        {
            "set": {"x": None, "true": None},  # y is a YAML 1.1 boolean, as a key "true"
            "omap": [{"a": 1}],
            "local": {"a": [1]},
            "uri": "text",
            "map": {"b": 2},
        }
    ]


def test_tagged_scalars_are_checked_against_their_tag(parser: Parser) -> None:
    assert load("a: !!int '12'\nb: !!binary aGVsbG8=\nc: !!timestamp 2001-12-14\n", parser) == [
        {"a": 12, "b": "hello", "c": "2001-12-14"}
    ]
    with pytest.raises(ManifestError, match="cannot decode 'x' as !!int"):
        load("a: !!int x\n", parser)


def test_a_syntax_error_in_the_document_wins_over_a_decoding_error_before_it(
    parser: Parser,
) -> None:
    with pytest.raises(ManifestError) as raised:
        load("a: 1\na: 2\nb: [1, 2\n", parser)
    assert (raised.value.line or 0) >= 3 and "given twice" not in str(raised.value)
    with pytest.raises(ManifestError, match="given twice"):  # in an earlier document: it wins
        load("a: 1\na: 2\n---\nb: [1, 2\n", parser)


def test_nesting_is_capped_where_libyaml_caps_it(parser: Parser) -> None:
    """1,000 open collections at most: the document's mapping and 999 lists inside it."""
    nested = load("a: " + "[" * 999 + "]" * 999 + "\n", parser)[0]["a"]
    depth = 1
    while nested:
        (nested,), depth = nested, depth + 1
    assert depth == 999
    with pytest.raises(ManifestError, match="exceeded maximum nesting depth"):
        load("a: " + "[" * 1000 + "]" * 1000 + "\n", parser)


def test_complex_keys_are_refused_showing_the_key(parser: Parser) -> None:
    with pytest.raises(ManifestError, match=r"unsupported map key \['a'\]"):
        load("? [a]\n: 1\n", parser)
