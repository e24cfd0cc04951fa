"""The run's ConfigMap: keys, data, the volume each task's Job mounts, the configs' total cap."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowforge.domain.caps import (
    MAX_CONFIG_BYTES,
    MAX_CONFIGS_TOTAL_BYTES,
    MAX_PARAMETERS_TOTAL_LENGTH,
    definition_cap_errors,
)
from flowforge.domain.execution import config_map_name
from flowforge.domain.run_files import (
    EMPTY_CONFIG_KEY,
    EMPTY_FILE_ANNOTATION,
    PARAMETERS_KEY,
    config_key,
    reserved_mount_path,
    run_files_data,
    task_items,
)
from flowforge.domain.states import TaskRole
from flowforge.kube.config_map import (
    METADATA_ONLY,
    ConfigMapCalls,
    build_config_map,
    same_config_map,
)
from flowforge.kube.errors import KubernetesRefusal
from flowforge.kube.jobs import ItemRef, JobRequest, build_job
from flowforge.sdk import run_parameters, task_config

# k8s.io/apimachinery IsConfigMapKey
CONFIG_MAP_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
# the apiserver's limit on a ConfigMap's keys and values together (core validation MaxSize)
CONFIG_MAP_MAX_BYTES = 1024 * 1024
FIXED_KEYS = {PARAMETERS_KEY, EMPTY_CONFIG_KEY}


@given(st.lists(st.text(min_size=1, max_size=80), unique=True, max_size=30))
def test_config_keys_are_valid_and_never_collide(task_keys: list[str]) -> None:
    keys = [config_key(task_key) for task_key in task_keys]
    assert all(CONFIG_MAP_KEY.fullmatch(key) and key not in (".", "..") for key in keys)
    assert len(set(keys)) == len(keys)
    assert not FIXED_KEYS & set(keys)


@given(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?", fullmatch=True))
def test_a_task_key_is_readable_in_its_config_key(task_key: str) -> None:
    assert config_key(task_key) == f"config.{task_key}.json"


@given(
    st.dictionaries(
        st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True),
        st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=20), max_size=3),
        max_size=20,
    ),
    st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=30), max_size=5),
)
def test_each_task_mounts_its_own_config_and_the_parameters(
    configs: dict[str, dict[str, Any]], parameters: dict[str, str]
) -> None:
    data = run_files_data(parameters, configs.items())
    assert json.loads(data[PARAMETERS_KEY]) == parameters
    for task_key, config in configs.items():
        items = task_items(task_key, config)
        files = {item["path"]: json.loads(data[item["key"]]) for item in items}
        assert files == {"parameters.json": parameters, "config.json": config}
    # the empty config is one shared key; every other key is one task's config
    assert len(data) == 2 + sum(1 for config in configs.values() if config)


def _request(task_key: str, config: dict[str, Any]) -> JobRequest:
    return JobRequest(
        namespace="team-a",
        run_name="etl-1",
        run_uid="uid-1",
        task_key=task_key,
        attempt=1,
        role=TaskRole.COMPENSATION,
        template={"image": "busybox:1.36", "env": [{"name": "FLOWFORGE_CONFIG", "value": "x"}]},
        config=config,
        parameters={"date": "2026-11-30"},
    )


def test_the_config_map_is_owned_by_the_run_and_the_job_mounts_it_read_only() -> None:
    config_map = build_config_map(
        namespace="team-a",
        run_name="etl-1",
        run_uid="uid-1",
        parameters={"date": "2026-11-30"},
        configs=[("undo", {"a": 1}), ("plain", {})],
    )
    metadata = config_map["metadata"]
    assert metadata["name"] == config_map_name(run_name="etl-1", run_uid="uid-1")
    assert metadata["labels"]["flowforge.io/run"] == "etl-1"
    assert metadata["labels"]["app.kubernetes.io/managed-by"] == "flowforge"
    (owner,) = metadata["ownerReferences"]
    assert owner["kind"] == "WorkflowRun" and owner["uid"] == "uid-1" and owner["controller"]
    assert config_map["immutable"] is True
    assert set(config_map["data"]) == {PARAMETERS_KEY, EMPTY_CONFIG_KEY, "config.undo.json"}

    pod = build_job(_request("undo", {"a": 1}))["spec"]["template"]["spec"]
    (volume,) = pod["volumes"]
    assert volume["configMap"]["name"] == metadata["name"]
    assert {item["key"] for item in volume["configMap"]["items"]} <= set(config_map["data"])
    (mount,) = pod["containers"][0]["volumeMounts"]
    assert mount == {"name": volume["name"], "mountPath": "/etc/flowforge", "readOnly": True}
    # the template's own variable of a name FlowForge no longer sets stays the template's
    env = {entry["name"]: entry.get("value") for entry in pod["containers"][0]["env"]}
    assert env["FLOWFORGE_CONFIG"] == "x"
    assert env["FLOWFORGE_CONFIG_FILE"] == "/etc/flowforge/config.json"


@pytest.mark.parametrize(
    ("changes", "mounted"),
    [
        ({}, False),
        ({"parameters": {"date": "2026-11-30"}}, True),
        ({"config": {"a": 1}}, True),
        ({"item": ItemRef(group="undo", key="us", json='"us"')}, True),
        ({"queue_name": "team-a"}, True),  # suspended: its template's annotations may change
    ],
)
def test_a_job_mounts_the_config_map_only_for_files_of_the_run_or_when_suspended(
    changes: dict[str, Any], mounted: bool
) -> None:
    """Otherwise both files are ``{}``, written by the downward API from FlowForge's own
    value of the Pod annotation, whatever the template sets it to."""
    template = {"image": "busybox:1.36", "annotations": {EMPTY_FILE_ANNOTATION: '{"n": 666}'}}
    request = dataclasses.replace(
        _request("undo", {}), **({"parameters": {}, "template": template} | changes)
    )
    pod = build_job(request)["spec"]["template"]
    (volume,) = pod["spec"]["volumes"]
    assert volume["name"] == "flowforge-run-files"
    assert ("configMap" in volume) is mounted
    if mounted:
        return
    field = f"metadata.annotations['{EMPTY_FILE_ANNOTATION}']"
    assert volume["downwardAPI"] == {
        "items": [
            {"path": "parameters.json", "fieldRef": {"fieldPath": field}},
            {"path": "config.json", "fieldRef": {"fieldPath": field}},
        ],
        "defaultMode": 0o444,
    }
    # byte for byte what the run's ConfigMap would hold for the two files
    data = run_files_data({}, [])
    assert pod["metadata"]["annotations"][EMPTY_FILE_ANNOTATION] == data[PARAMETERS_KEY]
    assert data[PARAMETERS_KEY] == data[EMPTY_CONFIG_KEY] == "{}"


def test_only_the_runs_own_config_map_is_taken_for_it() -> None:
    wanted = build_config_map(
        namespace="n", run_name="r", run_uid="u", parameters={}, configs=[("a", {"x": 1})]
    )
    assert same_config_map(json.loads(json.dumps(wanted)), wanted)
    squatted = json.loads(json.dumps(wanted))
    squatted["data"]["config.a.json"] = '{"x": 2}'
    assert not same_config_map(squatted, wanted)
    foreign = json.loads(json.dumps(wanted))
    foreign["metadata"]["ownerReferences"] = []
    assert not same_config_map(foreign, wanted)
    mutable = json.loads(json.dumps(wanted)) | {"immutable": False}
    assert not same_config_map(mutable, wanted)


def _spec(configs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tasks": [
            {"key": f"task-{index:05d}", "type": "t", "config": config}
            for index, config in enumerate(configs)
        ]
    }


def test_the_configs_of_a_definition_are_capped_in_total() -> None:
    near = {"blob": "x" * (MAX_CONFIG_BYTES - 100)}
    count = MAX_CONFIGS_TOTAL_BYTES // MAX_CONFIG_BYTES
    assert definition_cap_errors(_spec([near] * count)) == []
    ((path, message),) = definition_cap_errors(_spec([near] * (count + 1)))
    assert path == "spec.tasks" and f"at most {MAX_CONFIGS_TOTAL_BYTES}" in message
    # keys count too: many small configs
    small = {"n": 1}
    many = MAX_CONFIGS_TOTAL_BYTES // len('config.task-00000.json{"n": 1}') + 1
    assert definition_cap_errors(_spec([small] * many))[0][0] == "spec.tasks"
    # empty configs share one key and cost nothing
    assert definition_cap_errors(_spec([{}] * 10_000)) == []


def test_the_largest_config_map_fits_under_the_apiservers_limit() -> None:
    near = {"blob": "x" * (MAX_CONFIG_BYTES - 100)}
    count = MAX_CONFIGS_TOTAL_BYTES // MAX_CONFIG_BYTES
    # the parameters at their cap, each character escaped as a surrogate pair (12 bytes)
    parameters = {
        f"p{i:02d}": "\U0001f600" * (MAX_PARAMETERS_TOTAL_LENGTH // 64 - 3) for i in range(64)
    }
    data = run_files_data(parameters, ((f"task-{i:05d}", near) for i in range(count)))
    size = sum(len(key) + len(value.encode()) for key, value in data.items())
    assert size < CONFIG_MAP_MAX_BYTES, size


def test_the_mount_path_is_reserved_however_it_is_spelled() -> None:
    for path in ("/etc/flowforge", "/etc/flowforge/", "//etc/./flowforge/x", "/etc/x/../flowforge"):
        assert reserved_mount_path(path), path
    for path in ("/etc", "/etc/flowforge-data", "/data/etc/flowforge", "/tmp"):
        assert not reserved_mount_path(path), path


def test_the_sdk_reads_the_files_the_variables_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text('{"source": "s3://b"}')
    (tmp_path / "parameters.json").write_text('{"date": "2026-11-30"}')
    monkeypatch.setenv("FLOWFORGE_CONFIG_FILE", str(tmp_path / "config.json"))
    monkeypatch.setenv("FLOWFORGE_PARAMETERS_FILE", str(tmp_path / "parameters.json"))
    assert task_config() == {"source": "s3://b"}
    assert run_parameters() == {"date": "2026-11-30"}
    monkeypatch.delenv("FLOWFORGE_CONFIG_FILE")
    with pytest.raises(FileNotFoundError, match=re.escape("/etc/flowforge/config.json")):
        task_config()  # outside a task's container there is no default file


class _FakeCore:
    """The two ConfigMap calls of CoreV1Api, answering raw bodies as the client's threads do."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] | None = None
        self.headers: list[dict[str, str]] = []

    def create_namespaced_config_map(self, namespace: str, manifest: dict[str, Any]) -> bytes:
        if self.stored is not None:
            raise KubernetesRefusal("exists", status=409, reason="AlreadyExists")
        self.stored = {**manifest, "metadata": {**manifest["metadata"], "uid": "made-1"}}
        return json.dumps(self.stored).encode()

    def read_namespaced_config_map(
        self, name: str, namespace: str, _headers: dict[str, str] | None = None
    ) -> bytes:
        self.headers.append(dict(_headers or {}))
        if self.stored is None:
            raise KubernetesRefusal("not found", status=404, reason="NotFound")
        if _headers and "PartialObjectMetadata" in _headers.get("Accept", ""):
            return json.dumps({"metadata": self.stored["metadata"]}).encode()
        return json.dumps(self.stored).encode()


class _Calls(ConfigMapCalls):
    def __init__(self, core: _FakeCore) -> None:
        self._core = core  # type: ignore[assignment]

        async def call(function: Any, /, *args: Any, **kwargs: Any) -> bytes:
            result: bytes = function(*args, **kwargs)
            return result

        self._call = call
        self._call_critical = call


async def test_the_client_answers_the_config_map_made_and_reads_only_its_uid_after() -> None:
    core = _FakeCore()
    calls = _Calls(core)
    manifest = build_config_map(
        namespace="team-a", run_name="r", run_uid="u", parameters={}, configs=[("a", {})]
    )
    name = manifest["metadata"]["name"]
    assert await calls.config_map_uid(namespace="team-a", name=name) is None  # none yet
    made = await calls.create_config_map(manifest)
    assert made.created and made.uid == "made-1" and same_config_map(made.body, manifest)
    again = await calls.create_config_map(manifest)
    assert not again.created and again.uid == "made-1"
    assert await calls.config_map_uid(namespace="team-a", name=name) == "made-1"
    # the uid check asks for the metadata only, never the up to 1 MiB of data
    assert core.headers[-1] == {"Accept": METADATA_ONLY}
