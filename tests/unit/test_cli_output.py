"""``-o json|yaml|wide|name`` of the offline commands, and their one-line errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowforge.cli.connections import has_store, store_dsn
from flowforge.cli.main import main
from flowforge.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError, table

REPOSITORY = Path(__file__).parents[2]
SAGA = str(REPOSITORY / "examples" / "saga-order.yaml")
DIAMOND = str(REPOSITORY / "examples" / "etl-diamond.yaml")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def json_and_yaml_agree(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, as_json, _ = run(capsys, *argv, "-o", "json")
    assert code == EXIT_OK
    code, as_yaml, _ = run(capsys, *argv, "-o", "yaml")
    assert code == EXIT_OK and not as_yaml.startswith("---")
    assert yaml.safe_load(as_yaml) == json.loads(as_json)
    return json.loads(as_json)


def test_validate_in_every_form(capsys: pytest.CaptureFixture[str]) -> None:
    (report,) = json_and_yaml_agree(capsys, "validate", SAGA)
    assert report["valid"] and report["fingerprint"].startswith("sha256:")
    _, names, _ = run(capsys, "validate", SAGA, "-o", "name")
    assert names == f"workflowdefinition.flowforge.io/{report['name']}\n"
    _, wide, _ = run(capsys, "validate", SAGA, "-o", "wide")
    _, text, _ = run(capsys, "validate", SAGA)
    assert wide == text.replace("valid\n", f"valid {report['fingerprint']}\n")


def test_fingerprint_in_every_form(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = run(capsys, "fingerprint", DIAMOND)
    (item,) = json_and_yaml_agree(capsys, "fingerprint", DIAMOND)
    assert code == EXIT_OK and text == f"{item['fingerprint']}\n"
    _, wide, _ = run(capsys, "fingerprint", DIAMOND, "-o", "wide")
    header, row = wide.splitlines()
    assert header.split() == ["FILE", "NAME", "WORKFLOW", "VERSION", "FINGERPRINT"]
    assert row.split()[1] == item["name"] and row.split()[-1] == item["fingerprint"]


def test_plan_in_every_form(capsys: pytest.CaptureFixture[str]) -> None:
    schedule = json_and_yaml_agree(capsys, "plan", SAGA)
    _, names, _ = run(capsys, "plan", SAGA, "-o", "name")
    assert names.splitlines() == [f"task/{key}" for key in schedule["order"]]
    _, wide, _ = run(capsys, "plan", SAGA, "-o", "wide")
    rows = [line.split() for line in wide.splitlines()]
    assert rows[0] == ["TASK", "LEVEL", "TYPE", "DEPENDS-ON", "COMPENSATOR"]
    assert [row[0] for row in rows[1:]] == schedule["order"]
    levels = {row[0]: int(row[1]) for row in rows[1:]}
    assert all(
        levels[key] == number for number, level in enumerate(schedule["levels"]) for key in level
    )
    compensated = {row[0]: row[4] for row in rows[1:] if row[4] != "-"}
    assert compensated == schedule["compensation"]


def test_render_prints_kind_and_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "render", "examples/sdk_pipeline.py:pipeline", "-o", "name")
    assert (code, err) == (EXIT_OK, "")
    assert out == "workflowdefinition.flowforge.io/sharded-etl-v1\n"


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["plan", "nowhere.yaml"],
            EXIT_USAGE,
            "flowforge plan: nowhere.yaml: cannot read the file",
        ),
        (["fingerprint", "nowhere.yaml"], EXIT_USAGE, "flowforge fingerprint: nowhere.yaml:"),
        (["plan", "broken.yaml"], EXIT_FAILED, "flowforge plan: broken.yaml:3: did not find"),
        (["plan", "two.yaml"], EXIT_USAGE, "flowforge plan: two.yaml holds 2 WorkflowDefinition"),
        (["graph", "broken.yaml"], EXIT_FAILED, "flowforge graph: broken.yaml:3: did not find"),
        (["graph", "some-run"], EXIT_USAGE, "flowforge graph: some-run: no such file; to draw"),
    ],
)
def test_errors_are_one_line_with_the_code_of_their_blame(
    argv: list[str],
    code: int,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLOWFORGE_DSN", raising=False)
    (tmp_path / "broken.yaml").write_text("kind: WorkflowDefinition\nspec: [1, 2\n")
    diamond = Path(DIAMOND).read_text()
    (tmp_path / "two.yaml").write_text(
        diamond + "---\n" + diamond.replace("version: 1", "version: 2")
    )
    result, out, err = run(capsys, *argv)
    assert (result, out) == (code, "")
    assert err.startswith(message) and len(err.splitlines()) == 1, err


def test_tables_pad_columns_two_spaces_apart_without_trailing_blanks() -> None:
    assert table(["A", "LONGER"], [["xyz", ""], ["w", "v"]]) == "A    LONGER\nxyz\nw    v\n"


def test_a_dsn_in_the_environment_alone_does_not_read_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOWFORGE_SERVER", raising=False)
    monkeypatch.setenv("FLOWFORGE_CONFIG", str(tmp_path / "none.yaml"))
    # nothing listens on port 1: reading the store would fail with "store:"
    monkeypatch.setenv("FLOWFORGE_DSN", "postgresql://nobody@127.0.0.1:1/x?connect_timeout=2")
    for argv in (["get", "runs"], ["describe", "run", "r1"], ["graph", "r1"]):
        result, out, err = run(capsys, *argv, "-n", "team-a")
        assert (result, out) == (EXIT_USAGE, ""), err
        assert "--admin" in err and "store:" not in err, err


def test_the_dsn_in_the_environment_is_read_with_admin_and_by_the_admin_commands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLOWFORGE_DSN", "postgresql://admin@db/flowforge")
    reader = argparse.Namespace(dsn=None, admin=False)
    assert not has_store(reader)
    with pytest.raises(CommandError, match="FLOWFORGE_DSN is set, and is read only with --admin"):
        store_dsn(reader)
    assert store_dsn(argparse.Namespace(dsn=None, admin=True)) == "postgresql://admin@db/flowforge"
    assert store_dsn(argparse.Namespace(dsn="postgresql://x", admin=False)) == "postgresql://x"
    # db migrate/prune, doctor and retry have no server path: the variable is their DSN
    assert store_dsn(argparse.Namespace(dsn=None)) == "postgresql://admin@db/flowforge"
