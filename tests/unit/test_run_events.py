"""The Events on a WorkflowRun: one builder for a single Event and a series' Event."""

from __future__ import annotations

from datetime import UTC, datetime

from flowforge.domain.decision import Notice
from flowforge.kube.events import RunEvent, event_body, series_change, series_name

NOW = datetime(2026, 12, 1, 10, 0, 3, 900000, tzinfo=UTC)
EVENT = RunEvent(
    namespace="team-a",
    run_name="r" * 250,
    run_uid="0f1e2d3c-aaaa-bbbb-cccc-000000000000",
    notice=Notice("TaskFailed", "x" * 1500, warning=True),
)


def test_a_single_event_gets_a_generated_name_and_counts_one() -> None:
    body = event_body(EVENT, now=NOW)
    assert body["metadata"] == {"generateName": "r" * 200 + ".", "namespace": "team-a"}
    assert body["involvedObject"] == {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowRun",
        "name": "r" * 250,
        "namespace": "team-a",
        "uid": EVENT.run_uid,
    }
    assert (body["reason"], body["type"], body["count"]) == ("TaskFailed", "Warning", 1)
    assert body["message"] == "x" * 1000
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-12-01T10:00:03Z"
    assert body["source"] == {"component": "flowforge-operator"}


def test_a_series_event_is_named_and_updated_by_its_change() -> None:
    name = series_name(EVENT, suffix="taskfailed-w")
    assert name == "r" * 200 + ".0f1e2d3c.taskfailed-w"
    body = event_body(EVENT, now=NOW, name=name, count=7)
    assert body["metadata"] == {"name": name, "namespace": "team-a"}
    change = series_change(message=EVENT.message, count=7, now=NOW)
    assert change == {"message": "x" * 1000, "count": 7, "lastTimestamp": "2026-12-01T10:00:03Z"}
    assert {key: body[key] for key in change} == change
    assert (
        event_body(RunEvent("n", "run", "uid", Notice("TaskStarted", "m")), now=NOW)["type"]
        == "Normal"
    )
