"""The CLI's schedule commands: parsing, the table and the description (no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flowforge.cli.main import build_parser
from flowforge.cli.schedules import HEADERS, describe_text, schedule_row

NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
BODY: dict[str, Any] = {
    "metadata": {
        "name": "nightly-etl",
        "namespace": "team-a",
        "creationTimestamp": "2026-12-01T03:00:00Z",
    },
    "spec": {"workflow": "etl", "schedule": "0 2 * * *", "timeZone": "Europe/Paris"},
    "status": {
        "lastFire": {"nominalTime": "2026-12-02T01:00:00Z", "run": "nightly-etl-202612020200"},
        "nextFireTime": "2026-12-03T01:00:00Z",
        "nextFireTimes": ["2026-12-03T01:00:00Z"],
        "activeCount": 1,
        "active": ["nightly-etl-202612020200"],
        "missed": {"Overlap": 2},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Scheduled", "message": "ok"}],
    },
}


def test_get_and_describe_take_schedules_and_the_verbs_parse() -> None:
    parser = build_parser()
    assert parser.parse_args(["get", "schedules"]).type == "schedules"
    assert parser.parse_args(["get", "wfs", "-n", "x"]).namespace == "x"
    assert parser.parse_args(["describe", "schedule", "nightly-etl"]).runs == ["nightly-etl"]
    for verb in ("trigger", "suspend", "resume"):
        args = parser.parse_args(["schedule", verb, "nightly-etl"])
        assert args.name == "nightly-etl" and args.command_name == f"schedule {verb}"


def test_the_table_row_follows_the_printer_columns() -> None:
    assert len(schedule_row(BODY, NOW)) == len(HEADERS)
    assert schedule_row(BODY, NOW) == [
        "nightly-etl",
        "0 2 * * *",
        "Europe/Paris",
        "false",
        "2h",
        "2026-12-03T01:00:00Z",
        1,
        "1d",
    ]


def test_describe_shows_next_fires_missed_counts_and_the_runs_made() -> None:
    run = {
        "metadata": {
            "name": "nightly-etl-202612020200",
            "annotations": {"flowforge.io/nominal-time": "2026-12-02T01:00:00+00:00"},
        },
        "status": {"phase": "Running"},
    }
    text = describe_text(BODY, [run])
    assert "Schedule:       0 2 * * * in Europe/Paris" in text
    assert "Missed:         {'Overlap': 2}" in text
    assert "nightly-etl-202612020200  2026-12-02T01:00:00+00:00  Running" in text
    assert "Fires (store)" not in text
    fire = {
        "nominalTime": datetime(2026, 7, 1, 0, 0, tzinfo=UTC),
        "run": "nightly-etl-202607010200",
        "backfill": "july",
        "manual": False,
    }
    with_store = describe_text(BODY, [], [fire])
    assert "  2026-07-01T00:00:00Z  nightly-etl-202607010200  backfill july" in with_store
