"""``flowforge db migrate`` and ``flowforge db prune`` against a real server."""

from __future__ import annotations

import pytest

from flowforge.cli.main import main
from flowforge.store.migrate import known_migrations, newest_known_version

pytestmark = pytest.mark.store


def test_migrate_then_migrate_again_says_up_to_date(
    empty_database_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    newest = newest_known_version()
    versions = ", ".join(str(migration.version) for migration in known_migrations())

    assert main(["db", "migrate", "--dsn", empty_database_dsn]) == 0
    assert capsys.readouterr().out.strip() == (
        f"applied migrations {versions}; schema is at version {newest}"
    )
    assert main(["db", "migrate", "--dsn", empty_database_dsn]) == 0
    assert capsys.readouterr().out.strip() == f"schema is up to date at version {newest}"


def test_prune_reads_the_dsn_from_the_environment_and_reports_counts(
    store_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLOWFORGE_DSN", store_dsn)

    assert main(["db", "prune", "--older-than", "30d"]) == 0

    assert capsys.readouterr().out.strip() == (
        "pruned 0 finished runs: removed 0 task rows, 0 dependency rows and 0 events"
    )


def test_prune_rejects_a_duration_without_a_unit(
    store_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["db", "prune", "--dsn", store_dsn, "--older-than", "30"])
    assert exit_info.value.code == 2
    assert "invalid duration" in capsys.readouterr().err


def test_migrate_without_a_dsn_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FLOWFORGE_DSN", raising=False)
    assert main(["db", "migrate"]) == 2
    assert "FLOWFORGE_DSN" in capsys.readouterr().err
