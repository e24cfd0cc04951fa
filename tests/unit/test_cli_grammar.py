"""The command line's grammar: one verb form, kubectl's flags, and a parser that imports little."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from flowforge.cli import api_client, commands
from flowforge.cli.lazy import LazyHandler
from flowforge.cli.main import build_parser, main
from flowforge.domain import rendering
from flowforge.kube import webhook_config
from flowforge.store import lease
from tests.support.cli import python

REPOSITORY = Path(__file__).parents[2]
HEAVY = ("kubernetes", "psycopg", "pydantic", "yaml", "jsonschema", "flowforge.domain")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_listed_commands_are_verbs_and_db_rollback_and_schedule_the_groups() -> None:
    listed = [
        action.dest
        for action in build_parser()._subparsers._group_actions[0]._choices_actions  # type: ignore[union-attr]
    ]
    assert listed == [
        "validate",
        "fingerprint",
        "plan",
        "graph",
        "render",
        "get",
        "describe",
        "cancel",
        "retry",
        "rollback",
        "pause",  # issue 29: WorkflowRunAction Pause/Resume
        "resume",
        "approve",  # issue 29: an approval gate's Approve/Reject
        "reject",
        "logs",
        "schedule",  # issue 28: flowforge schedule trigger|suspend|resume NAME
        "server",
        "doctor",
        "db",
    ]


def test_every_command_that_prints_objects_takes_kubectl_s_output_flag() -> None:
    parsers = subcommands(build_parser())
    expected = {
        "validate": ["json", "yaml", "wide", "name"],
        "fingerprint": ["json", "yaml", "wide", "name"],
        "plan": ["json", "yaml", "wide", "name"],
        "get": ["json", "yaml", "wide", "name"],
        "describe": ["json", "yaml", "wide", "name"],
        "cancel": ["json", "yaml", "name"],
        "retry": ["json", "yaml", "name"],
        "doctor": ["json", "yaml"],
        "render": ["yaml", "json", "name"],
        "graph": ["mermaid", "dot"],
    }
    for name, forms in expected.items():
        (output,) = (a for a in parsers[name]._actions if "-o" in a.option_strings)
        assert list(output.choices or ()) == forms, name
        assert "--output" in output.option_strings


def test_graph_s_format_is_o_or_format_and_never_f() -> None:
    parser = build_parser()
    graph = subcommands(parser)["graph"]
    assert not any("-f" in action.option_strings for action in graph._actions)
    for flag in ("-o", "--output", "--format"):
        assert parser.parse_args(["graph", "x.yaml", flag, "dot"]).graph_format == "dot"
    with pytest.raises(SystemExit) as raised:
        parser.parse_args(["graph", "x.yaml", "-f", "dot"])
    assert raised.value.code == 2


def test_old_spellings_are_hidden_aliases_of_get_and_describe() -> None:
    parser = build_parser()
    for old, new in (
        (["runs", "list", "--limit", "3"], ["get", "runs", "--limit", "3"]),
        (["runs", "show", "r1"], ["describe", "run", "r1"]),
    ):
        before, after = vars(parser.parse_args(old)), vars(parser.parse_args(new))
        assert before.pop("handler").function == after.pop("handler").function
        for name in ("runs_command", "command", "type"):
            before.pop(name, None), after.pop(name, None)
        assert before == after
    assert not any(line.split()[:1] == ["runs"] for line in parser.format_help().splitlines())


def test_the_parser_s_copies_of_heavy_modules_values_match_them() -> None:
    assert commands.GRAPH_FORMATS == rendering.GRAPH_FORMATS
    assert commands.DIRECTIONS == rendering.DIRECTIONS
    assert commands.WEBHOOK_CONFIGURATION == webhook_config.CONFIGURATION_NAME
    assert commands.OPERATOR_LEASE == lease.DEFAULT_LEASE
    assert commands.SERVER_VARIABLE == api_client.SERVER_VARIABLE


def test_every_handler_names_a_function_that_exists() -> None:
    seen = 0
    pending = [build_parser()]
    while pending:
        for parser in subcommands(pending.pop()).values():
            if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
                pending.append(parser)
                continue
            handler = parser.get_default("handler")
            assert isinstance(handler, LazyHandler), parser.prog
            module = __import__(handler.module, fromlist=[handler.function])
            assert callable(getattr(module, handler.function)), parser.prog
            seen += 1
    assert seen == 25  # db, rollback and the hidden runs group hold two each, schedule three


def test_help_imports_nothing_heavy() -> None:
    result = python(
        "-c",
        "import sys; from flowforge.cli.main import build_parser; build_parser().format_help();"
        f"print([m for m in sys.modules if m.startswith({HEAVY!r})])",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert python("-m", "flowforge.cli.main", "--help").returncode == 0


def test_offline_commands_import_neither_the_kubernetes_client_nor_psycopg(
    tmp_path: Path,
) -> None:
    code = (
        "import sys; from flowforge.cli.main import main; code = main(sys.argv[1:]);"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes', 'psycopg'}),"
        " file=sys.stderr); sys.exit(code)"
    )
    example = str(REPOSITORY / "examples" / "etl-diamond.yaml")
    for argv in (["plan", example], ["validate", example], ["graph", example]):
        result = python("-c", code, *argv, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stderr.strip().splitlines()[-1] == "[]", argv


def test_usage_errors_exit_2_and_a_group_without_a_verb_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["db"], ["get"], ["describe", "run"], ["get", "pods"], ["plan", "-o", "xml", "x"]):
        with pytest.raises(SystemExit) as raised:
            main(argv)
        assert raised.value.code == 2, argv
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_json_help_of_validate_names_its_fields() -> None:
    validate = subcommands(build_parser())["validate"]
    assert all(field in validate.description for field in ("fingerprint", "errors"))  # type: ignore[operator]
    assert json.loads("[]") == []  # the JSON form of no definitions, checked in test_cli_output
