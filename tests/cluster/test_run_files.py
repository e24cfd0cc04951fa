"""A run's parameters and its tasks' configs reach the containers as files of one ConfigMap
per run, owned by the run, mounted read-only; the garbage collector deletes it with the run.

kwok plays the kubelet here and runs no container, so what a container would read is
projected from the ConfigMap by the volume's own ``items`` (as the kubelet does) into a
directory, and the SDK's readers run against it with the Job's own environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from flowforge.domain.caps import MAX_CONFIG_BYTES
from flowforge.domain.execution import config_map_name
from tests.plugins.operator import OperatorProcess, RunDriver
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

READ_FILES = (
    "import json; from flowforge.sdk import run_parameters, task_config; "
    "print(json.dumps({'config': task_config(), 'parameters': run_parameters()}))"
)


def _project(config_map: dict[str, Any], volume: dict[str, Any], into: Path) -> None:
    """What the kubelet writes for a ConfigMap volume with ``items``: only those keys."""
    into.mkdir(parents=True)
    for item in volume["configMap"]["items"]:
        (into / item["path"]).write_text(config_map["data"][item["key"]], encoding="utf-8")


def _read_as_the_task(env: dict[str, str], *, mount_path: str, files: Path) -> dict[str, Any]:
    moved = {
        name: value.replace(mount_path, str(files), 1) if value.startswith(mount_path) else value
        for name, value in env.items()
    }
    result = subprocess.run(
        [sys.executable, "-c", READ_FILES], env=moved, capture_output=True, text=True, check=True
    )
    read: dict[str, Any] = json.loads(result.stdout)
    return read


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
        (volume,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == name]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True and mount["mountPath"] == "/etc/flowforge"
        env = {entry["name"]: entry["value"] for entry in container["env"]}
        assert "FLOWFORGE_CONFIG" not in env and "FLOWFORGE_PARAMETERS" not in env
        assert max(len(value.encode()) for value in env.values()) < ENV_STRING_LIMIT
        # a config near the per-task cap leaves its Job small: it is in the ConfigMap
        text = json.dumps(job)
        assert len(text.encode()) < JOB_SIZE_CEILING and BIG["blob"] not in text, task

        files = tmp_path / task
        _project(config_map, volume, files)
        assert sorted(path.name for path in files.iterdir()) == ["config.json", "parameters.json"]
        read = _read_as_the_task(env, mount_path=mount["mountPath"], files=files)
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
