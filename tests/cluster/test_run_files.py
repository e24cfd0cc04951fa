"""A run's parameters and its tasks' configs reach the containers as files of one ConfigMap
per run, owned by the run, mounted read-only; the garbage collector deletes it with the run.
A run with neither makes no ConfigMap: its tasks read the same files from their Pods' own
annotation.

kwok plays the kubelet here and runs no container, so what a container would read is
projected from the ConfigMap by the volume's own ``items`` (as the kubelet does) into a
directory, and the SDK's readers run against it with the Job's own environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from flowforge.domain.caps import MAX_CONFIG_BYTES
from flowforge.domain.execution import config_map_name
from flowforge.domain.run_files import EMPTY_FILE_ANNOTATION
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.run_files import project, read_as_the_task, run_files_volume
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.cluster

STEP = {
    "image": "busybox:1.36",
    "command": ["sh", "-c", 'cat "$FLOWFORGE_CONFIG_FILE"'],
    "annotations": {"flowforge.io/simulate-duration": "1s"},
}
BIG = {"blob": "x" * (MAX_CONFIG_BYTES - 100)}
SMALL = {"source": "s3://b", "tags": ["a", "ü"]}
PARAMETERS = {"date": "2026-11-30", "note": "ü" * 4000}
# Linux's MAX_ARG_STRLEN; a sixteenth of the 1 MiB no Job may approach
ENV_STRING_LIMIT = 128 * 1024
JOB_SIZE_CEILING = 64 * 1024


async def test_tasks_read_config_and_parameters_from_the_runs_config_map(
    operator: OperatorProcess, driver: RunDriver, kube_api: k8s.ApiClient, tmp_path: Path
) -> None:
    await driver.publish(
        {
            "workflow": "files",
            "version": 1,
            "taskTypes": {"step": STEP},
            "tasks": [
                {"key": "big", "type": "step", "config": BIG},
                {"key": "small", "type": "step", "config": SMALL},
                {"key": "plain", "type": "step"},
            ],
        }
    )
    driver.create_run("f1", workflow="files", parameters=PARAMETERS)
    body = await driver.wait_phase("f1", {"Succeeded", "Failed"}, operator=operator)
    assert body["status"]["phase"] == "Succeeded", body["status"]
    run_uid = body["metadata"]["uid"]

    core = k8s.CoreV1Api(kube_api)
    name = config_map_name(run_name="f1", run_uid=run_uid)
    config_map = kube_api.sanitize_for_serialization(
        core.read_namespaced_config_map(name, driver.namespace)
    )
    (owner,) = config_map["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("WorkflowRun", "f1", run_uid)
    assert owner["controller"] is True
    assert config_map["immutable"] is True
    assert config_map["metadata"]["labels"]["flowforge.io/run"] == "f1"

    expected = {"big": BIG, "small": SMALL, "plain": {}}
    jobs = [kube_api.sanitize_for_serialization(job) for job in driver.jobs("f1")]
    assert sorted(job["metadata"]["labels"]["flowforge.io/task"] for job in jobs) == sorted(
        expected
    )
    for job in jobs:
        task = job["metadata"]["labels"]["flowforge.io/task"]
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        volume = run_files_volume(pod)
        assert volume["configMap"]["name"] == name
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True and mount["mountPath"] == "/etc/flowforge"
        env = {entry["name"]: entry["value"] for entry in container["env"]}
        assert "FLOWFORGE_CONFIG" not in env and "FLOWFORGE_PARAMETERS" not in env
        assert max(len(value.encode()) for value in env.values()) < ENV_STRING_LIMIT
        # a config near the per-task cap leaves its Job small: it is in the ConfigMap
        text = json.dumps(job)
        assert len(text.encode()) < JOB_SIZE_CEILING and BIG["blob"] not in text, task

        files = tmp_path / task
        project(volume, into=files, config_map=config_map)
        assert sorted(path.name for path in files.iterdir()) == ["config.json", "parameters.json"]
        read = read_as_the_task(env, files=files)
        assert read == {"config": expected[task], "parameters": PARAMETERS}, task

    driver.delete_run("f1")

    def collected() -> bool:
        try:
            core.read_namespaced_config_map(name, driver.namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_until_blocking(
        collected, timeout=60, what="the garbage collector to delete the run's ConfigMap"
    )


async def test_a_run_without_parameters_or_configs_reads_the_same_files_without_a_config_map(
    operator: OperatorProcess, driver: RunDriver, kube_api: k8s.ApiClient, tmp_path: Path
) -> None:
    """Both files are ``{}``: the Jobs mount them from their Pods' own annotation (a downward
    API volume of the same name at the same path), no ConfigMap is made, and neither a
    ConfigMap someone put under the run's ConfigMap name nor the template's own value of the
    annotation reaches the task."""
    forged_value = '{"forged": true}'
    step = {**STEP, "annotations": {**STEP["annotations"], EMPTY_FILE_ANNOTATION: forged_value}}
    await driver.publish(
        {
            "workflow": "plain",
            "version": 1,
            "taskTypes": {"step": step},
            "tasks": [
                {"key": "a", "type": "step"},
                {"key": "b", "type": "step", "dependsOn": ["a"]},
            ],
        }
    )
    created = driver.create_run("p1", workflow="plain")
    core = k8s.CoreV1Api(kube_api)
    name = config_map_name(run_name="p1", run_uid=created["metadata"]["uid"])
    # someone else's ConfigMap under the name the run's would have: never mounted
    forged = k8s.V1ConfigMap(
        metadata=k8s.V1ObjectMeta(name=name, labels={"flowforge.io/run": "p1"}),
        data={"parameters.json": forged_value, "empty-config.json": forged_value},
        immutable=True,
    )
    core.create_namespaced_config_map(driver.namespace, forged)
    body = await driver.wait_phase("p1", {"Succeeded", "Failed"}, operator=operator)
    assert body["status"]["phase"] == "Succeeded", body["status"]

    owned = core.list_namespaced_config_map(driver.namespace, label_selector="flowforge.io/run=p1")
    assert [item.metadata.uid for item in owned.items] == [
        core.read_namespaced_config_map(name, driver.namespace).metadata.uid
    ]  # the forged one only: the run made none
    jobs = driver.jobs("p1")
    assert len(jobs) == 2
    for job in jobs:
        task = job.metadata.labels["flowforge.io/task"]
        pod_spec = kube_api.sanitize_for_serialization(job.spec.template.spec)
        volume = run_files_volume(pod_spec)
        assert "configMap" not in volume and volume["downwardAPI"]["defaultMode"] == 0o444
        (container,) = pod_spec["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount == {"name": volume["name"], "mountPath": "/etc/flowforge", "readOnly": True}
        env = {entry["name"]: entry["value"] for entry in container["env"]}
        assert env["FLOWFORGE_CONFIG_FILE"] == "/etc/flowforge/config.json"
        assert env["FLOWFORGE_PARAMETERS_FILE"] == "/etc/flowforge/parameters.json"
        # the Pod the Job controller made (the kubelet reads its annotations)
        (pod,) = core.list_namespaced_pod(
            driver.namespace,
            label_selector=f"batch.kubernetes.io/controller-uid={job.metadata.uid}",
        ).items
        files = tmp_path / task
        project(volume, into=files, pod_annotations=pod.metadata.annotations)
        assert sorted(path.name for path in files.iterdir()) == ["config.json", "parameters.json"]
        assert read_as_the_task(env, files=files) == {"config": {}, "parameters": {}}, task
