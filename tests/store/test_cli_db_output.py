"""``flowforge db`` reports for programs: ``-o json`` and ``-o yaml`` of migrate and prune."""

from __future__ import annotations

import json

import pytest
import yaml

from flowforge.cli.main import main

pytestmark = pytest.mark.store


def test_migrate_and_prune_reports_as_json_and_yaml(
    empty_database_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = ["--dsn", empty_database_dsn]
    assert main(["db", "migrate", *dsn, "-o", "json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["applied"][0] == 1 and first["schemaVersion"] == first["applied"][-1]
    assert main(["db", "migrate", *dsn, "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == {
        "applied": [],
        "schemaVersion": first["schemaVersion"],
    }
    assert main(["db", "prune", *dsn, "--older-than", "1d", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "runs": 0,
        "tasks": 0,
        "dependencies": 0,
        "events": 0,
    }
