"""The run's ConfigMap, created once before its first Job that mounts it, against the real
store and the Kubernetes fake: shared by concurrent creations, idempotent across restarts,
never taken from someone else, forgotten when the run finishes; a Job whose files are both
``{}`` mounts none and reads the same files from its Pod's annotation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from flowforge.domain.execution import config_map_name
from flowforge.domain.run_files import EMPTY_FILE_ANNOTATION
from flowforge.domain.states import RunPhase, TaskState
from flowforge.kube.config_map import build_config_map
from flowforge.operator import metrics
from flowforge.store.queries import latest_outcomes
from tests.engine.conftest import NAMESPACE, Harness, task_of_job
from tests.support.run_files import project, read_as_the_task, run_files_volume

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
        volume = run_files_volume(job["spec"]["template"]["spec"])
        if task_of_job(job) == "c":  # no config, no parameters: nothing of the run to mount
            assert "configMap" not in volume and "downwardAPI" in volume
        else:
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


def _files_read(job: dict[str, Any], into: Path, config_map: dict[str, Any] | None = None) -> Any:
    """What the Job's task container reads, its Pod made from the Job's template."""
    pod = job["spec"]["template"]
    volume = run_files_volume(pod["spec"])
    project(
        volume, into=into, config_map=config_map, pod_annotations=pod["metadata"]["annotations"]
    )
    (container,) = pod["spec"]["containers"]
    return read_as_the_task({e["name"]: e["value"] for e in container["env"]}, files=into)


PLAIN = [{"key": "a"}, {"key": "b", "dependsOn": ["a"]}]


async def test_a_run_without_parameters_or_configs_makes_no_config_map(
    harness: Harness, tmp_path: Path
) -> None:
    """Its tasks read the same files, ``{}`` both, at the same paths; nothing someone else
    puts under the name the run's ConfigMap would have, nor the template's own value of the
    annotation, reaches them."""
    body = await harness.unstarted(
        "plain", PLAIN, task_type={"annotations": {EMPTY_FILE_ANNOTATION: '{"n": 666}'}}
    )
    metadata = body["metadata"]
    name = config_map_name(run_name=metadata["name"], run_uid=metadata["uid"])
    forged = {"metadata": {"name": name, "uid": "attacker-uid"}, "data": {"x": '{"n": 666}'}}
    harness.kube.config_maps[(NAMESPACE, name)] = forged
    await harness.engine.start_run(body)
    await harness.settle_background()
    context = await harness.engine.runs.by_uid(namespace=NAMESPACE, uid=metadata["uid"])
    assert context is not None
    await harness.finish("a")
    await harness.finish("b")

    assert (await harness.run(context)).phase is RunPhase.SUCCEEDED
    assert (harness.kube.config_map_calls, harness.kube.config_map_reads) == (0, 0)
    assert harness.kube.config_maps == {(NAMESPACE, name): forged}
    assert len(harness.engine.launcher.files) == 0
    for key in ("a", "b"):
        job = harness.kube.jobs[(NAMESPACE, harness.job_of(key))]
        assert _files_read(job, tmp_path / key) == {"config": {}, "parameters": {}}


async def test_a_run_with_parameters_still_gets_its_own_config_map(
    harness: Harness, tmp_path: Path
) -> None:
    body = await harness.unstarted("params", PLAIN[:1])
    body["spec"]["parameters"] = {"date": "2026-11-30"}
    await harness.engine.start_run(body)
    await harness.settle_background()

    assert harness.kube.config_map_calls == 1
    config_map = _config_map(harness, body)
    job = harness.kube.jobs[(NAMESPACE, harness.job_of("a"))]
    volume = run_files_volume(job["spec"]["template"]["spec"])
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    read = _files_read(job, tmp_path / "a", config_map)
    assert read == {"config": {}, "parameters": {"date": "2026-11-30"}}
