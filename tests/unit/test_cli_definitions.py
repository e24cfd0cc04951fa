"""``flowforge validate | fingerprint | plan`` as pipelines run them: a subprocess per call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import flowforge

VALID = """\
apiVersion: flowforge.io/v1alpha1
kind: WorkflowDefinition
metadata: {name: etl-v3}
spec:
  workflow: etl
  version: 3
  description: Nightly ETL
  taskTypes:
    py: {image: "python:3.12-slim", command: [python, -m, steps]}
  tasks:
    - {key: load, type: py, dependsOn: [transform]}
    - {key: extract, type: py, config: {date: 2026-11-30}}
    - {key: transform, type: py, dependsOn: [extract]}
    - {key: check, type: py, dependsOn: [extract]}
    - {key: undo-extract, type: py, compensateFor: extract}
"""

INVALID = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: not-a-definition}
data: {a: b}
---
apiVersion: flowforge.io/v1alpha1
kind: WorkflowDefinition
metadata: {name: broken}
spec:
  workflow: etl
  version: 4
  taskTypes: {py: {image: busybox}}
  tasks:
    - {key: a, type: py, dependsOn: [b]}
    - {key: b, type: py, dependsOn: [a, ghost]}
---
apiVersion: flowforge.io/v1alpha1
kind: WorkflowDefinition
metadata: {name: malformed}
spec:
  workflow: etl
  version: 5
  tasks: []
"""


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "valid.yaml").write_text(VALID)
    (tmp_path / "invalid.yaml").write_text(INVALID)
    (tmp_path / "broken.yaml").write_text("kind: WorkflowDefinition\nspec: [1, 2\n")
    return tmp_path


def test_validate_a_valid_file_exits_0(files: Path) -> None:
    result = flowforge("validate", "valid.yaml", cwd=files)
    assert result.returncode == 0, result.stderr
    assert "etl-v3" in result.stdout and "valid" in result.stdout


def test_validate_json_lists_every_definition_and_passes_over_other_kinds(files: Path) -> None:
    result = flowforge("validate", "-o", "json", "valid.yaml", "invalid.yaml", cwd=files)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert [(item["file"], item["index"], item["name"], item["valid"]) for item in report] == [
        ("valid.yaml", 0, "etl-v3", True),
        ("invalid.yaml", 1, "broken", False),
        ("invalid.yaml", 2, "malformed", False),
    ]
    assert report[0]["errors"] == []
    assert report[1]["errors"] == [
        {
            "kind": "unknown-dependency",
            "path": "spec.tasks[1].dependsOn[1]",
            "message": 'task "b" depends on unknown task "ghost"',
        },
        {
            "kind": "cycle",
            "path": "spec.tasks",
            "message": "dependency cycle detected: a -> b -> a",
        },
    ]
    assert report[2]["errors"] == [
        {"kind": "schema", "path": "spec.tasks", "message": "must not be empty"}
    ]


def test_validate_text_shows_paths_and_kinds(files: Path) -> None:
    result = flowforge("validate", "invalid.yaml", cwd=files)
    assert result.returncode == 1
    assert "spec.tasks[1].dependsOn[1]" in result.stdout and "[unknown-dependency]" in result.stdout


def test_an_unparseable_file_is_invalid_input_exiting_1_naming_file_and_line(
    files: Path,
) -> None:
    result = flowforge("validate", "valid.yaml", "broken.yaml", cwd=files)
    assert result.returncode == 1
    assert "broken.yaml:" in result.stderr
    line = result.stderr.split("broken.yaml:")[1].split(":")[0]
    assert line.isdigit()
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_missing_file_is_a_usage_error_exiting_2(files: Path) -> None:
    result = flowforge("validate", "nowhere.yaml", cwd=files)
    assert result.returncode == 2
    assert "nowhere.yaml" in result.stderr


def test_usage_errors_exit_2(files: Path) -> None:
    assert flowforge("validate", cwd=files).returncode == 2
    assert flowforge("validate", "-o", "xml", "valid.yaml", cwd=files).returncode == 2


def test_an_unquoted_date_in_config_is_a_string_as_in_the_cluster(files: Path) -> None:
    first = flowforge("fingerprint", "valid.yaml", cwd=files)
    quoted = VALID.replace("{date: 2026-11-30}", '{date: "2026-11-30"}')
    (files / "quoted.yaml").write_text(quoted)
    second = flowforge("fingerprint", "quoted.yaml", cwd=files)
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout


def test_fingerprint_prints_one_line_per_definition(files: Path) -> None:
    (files / "two.yaml").write_text(VALID + "---\n" + VALID.replace("version: 3", "version: 4"))
    result = flowforge("fingerprint", "two.yaml", cwd=files)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0] != lines[1]
    assert all(line.startswith("sha256:") and len(line) == 71 for line in lines)


def test_fingerprint_of_an_invalid_definition_exits_1(files: Path) -> None:
    result = flowforge("fingerprint", "invalid.yaml", cwd=files)
    assert result.returncode == 1
    assert "ghost" in result.stderr


def test_plan_json(files: Path) -> None:
    result = flowforge("plan", "-o", "json", "valid.yaml", cwd=files)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "order": ["extract", "check", "transform", "load"],
        "levels": [["extract"], ["check", "transform"], ["load"]],
        "compensation": {"extract": "undo-extract"},
    }


def test_plan_text_shows_levels_and_compensation(files: Path) -> None:
    result = flowforge("plan", "valid.yaml", cwd=files)
    assert result.returncode == 0
    assert "level 1: check  transform" in result.stdout
    assert "extract  undone by  undo-extract" in result.stdout


def test_plan_of_an_invalid_definition_exits_1(files: Path) -> None:
    (files / "cyclic.yaml").write_text(INVALID.split("---\n")[1])
    result = flowforge("plan", "cyclic.yaml", cwd=files)
    assert result.returncode == 1
    assert "a -> b -> a" in result.stderr


GATED = """\
apiVersion: flowforge.io/v1alpha1
kind: WorkflowDefinition
metadata: {name: release-v1}
spec:
  workflow: release
  version: 1
  taskTypes: {ok: {image: busybox:1.36}}
  tasks:
    - {key: build, type: ok}
    - key: approve-prod
      dependsOn: [build]
      approval: {approvers: {users: [alice], groups: [release-managers]}, required: 2,
                 forbidSelf: true, timeoutSeconds: 3600}
    - {key: deploy, type: ok, dependsOn: [approve-prod]}
  finally:
    - {key: notify, type: ok}
    - {key: release-lock, type: ok}
"""


def test_plan_shows_an_approval_gate_and_the_finally_tasks(tmp_path: Path) -> None:
    (tmp_path / "gated.yaml").write_text(GATED)

    text = flowforge("plan", "gated.yaml", cwd=tmp_path)
    wide = flowforge("plan", "-o", "wide", "gated.yaml", cwd=tmp_path)

    assert text.returncode == 0, text.stderr
    assert (
        "approval gate approve-prod: 2 approval(s) from alice, group release-managers, not "
        "the run's creator; rejected after 3600 s"
    ) in text.stdout
    assert "finally (once the outcome is decided, one at a time): notify -> release-lock" in (
        text.stdout
    )
    assert "approve-prod  1      approval" in wide.stdout
