"""The run's ConfigMap, created once before its first Job, against the real store and the
Kubernetes fake: shared by concurrent creations, idempotent across restarts, never taken
from someone else, forgotten when the run finishes."""

from __future__ import annotations

import copy
import json
from typing import Any

from flowforge.domain.execution import config_map_name
from flowforge.domain.states import RunPhase, TaskState
from flowforge.kube.config_map import build_config_map
from flowforge.operator import metrics
from flowforge.store.queries import latest_outcomes
from tests.engine.conftest import NAMESPACE, Harness

FAN_OUT: list[dict[str, Any]] = [
    {"key": "a", "config": {"n": 1}},
    {"key": "b", "config": {"n": 2}},
    {"key": "c"},
]


def _config_map(harness: Harness, body: dict[str, Any]) -> dict[str, Any]:
    metadata = body["metadata"]
    name = config_map_name(run_name=metadata["name"], run_uid=metadata["uid"])
    return harness.kube.config_maps[(NAMESPACE, name)]


async def test_one_config_map_serves_a_fan_out_and_is_forgotten_when_the_run_ends(
    harness: Harness,
) -> None:
    run = await harness.start("fan", FAN_OUT)
    await harness.settle_background()
    assert harness.kube.config_map_calls == 1  # three Jobs created at once, one ConfigMap
    config_map = _config_map(harness, harness.kube.runs[(NAMESPACE, "fan")])
    assert json.loads(config_map["data"]["config.a.json"]) == {"n": 1}
    assert len(harness.kube.jobs) == 3
    for job in harness.kube.jobs.values():
        (volume,) = job["spec"]["template"]["spec"]["volumes"]
        assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert len(harness.engine.launcher.files) == 1
    for key in ("a", "b", "c"):
        await harness.finish(key)
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
    assert len(harness.engine.launcher.files) == 0


async def test_the_runs_own_config_map_found_after_a_restart_is_used(harness: Harness) -> None:
    body = await harness.unstarted("again", FAN_OUT[:1])
    metadata = body["metadata"]
    # what the process before the restart (or the leader before this one) created
    made = build_config_map(
        namespace=NAMESPACE,
        run_name=metadata["name"],
        run_uid=metadata["uid"],
        parameters={},
        configs=[("a", {"n": 1})],
    )
    harness.kube.config_maps[(NAMESPACE, made["metadata"]["name"])] = copy.deepcopy(made)
    await harness.engine.start_run(body)
    await harness.settle_background()
    assert harness.kube.config_map_calls == 1
    assert _config_map(harness, body) == made
    assert len(harness.kube.created) == 1


async def test_a_config_map_someone_else_put_under_the_name_fails_the_attempt(
    harness: Harness,
) -> None:
    body = await harness.unstarted("squat", FAN_OUT[:1])
    metadata = body["metadata"]
    name = config_map_name(run_name=metadata["name"], run_uid=metadata["uid"])
    harness.kube.config_maps[(NAMESPACE, name)] = {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"parameters.json": "{}", "config.a.json": '{"n": 666}'},
    }
    await harness.engine.start_run(body)
    await harness.settle_background()
    assert harness.kube.created == []
    context = await harness.engine.runs.by_uid(namespace=NAMESPACE, uid=metadata["uid"])
    assert context is not None
    assert (await harness.states(context))["a"] == TaskState.FAILED
    outcome = (await latest_outcomes(harness.pool, context.run_id, ["a"]))["a"]
    assert outcome["reason"] == "JobRefused"
    assert "is not this run's" in outcome["message"]


PAIR: list[dict[str, Any]] = [
    {"key": "a", "config": {"n": 1}},
    {"key": "b", "config": {"n": 2}, "dependsOn": ["a"]},
]


async def test_a_config_map_deleted_and_re_created_by_someone_else_is_never_mounted(
    harness: Harness,
) -> None:
    """An attacker who may write ConfigMaps swaps the run's for one with other configs, even
    with the run as owner and immutable, as the run's own looks: the next task fails rather
    than mount it."""
    run = await harness.start("swapped", PAIR)
    body = harness.kube.runs[(NAMESPACE, "swapped")]
    own = copy.deepcopy(_config_map(harness, body))
    forged = copy.deepcopy(own)
    forged["metadata"]["uid"] = "attacker-uid"
    forged["data"]["config.b.json"] = '{"n": 666}'
    harness.kube.config_maps[(NAMESPACE, own["metadata"]["name"])] = forged
    before = metrics.REGISTRY.get_sample_value("flowforge_forged_jobs_total", {"act": "mount"})

    await harness.finish("a")

    assert (await harness.states(run))["b"] == TaskState.FAILED
    assert [name for name in harness.kube.created if "-b-" in name] == []
    outcome = (await latest_outcomes(harness.pool, run.run_id, ["b"]))["b"]
    assert outcome["reason"] == "JobRefused"
    assert "re-created by someone else (uid attacker-uid" in outcome["message"]
    assert own["metadata"]["uid"] in outcome["message"]
    event = next(e for e in harness.kube.events if e.reason == "ForgedConfigMap")
    assert "attacker-uid" in event.message and "task b attempt 1" in event.message
    after = metrics.REGISTRY.get_sample_value("flowforge_forged_jobs_total", {"act": "mount"})
    assert after == (before or 0) + 1
    assert _config_map(harness, body) == forged  # someone else's: not touched


async def test_a_deleted_config_map_is_made_again_from_the_runs_own_data(
    harness: Harness,
) -> None:
    run = await harness.start("deleted", PAIR)
    body = harness.kube.runs[(NAMESPACE, "deleted")]
    own = copy.deepcopy(_config_map(harness, body))
    del harness.kube.config_maps[(NAMESPACE, own["metadata"]["name"])]
    reads = harness.kube.config_map_reads

    await harness.finish("a")

    assert harness.kube.config_map_reads == reads + 1  # the uid was checked before b's Job
    again = _config_map(harness, body)
    assert again["data"] == own["data"] and again["metadata"]["uid"] != own["metadata"]["uid"]
    assert harness.job_of("b")
    await harness.finish("b")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
