"""What a task's container reads of its run files, without a kubelet: the files its volume
`flowforge-run-files` would show, written into a directory, and the SDK's readers run on
them with the Job's own environment (the mount path moved to that directory).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowforge.domain.run_files import MOUNT_PATH, VOLUME_NAME

READ_FILES = (
    "import json; from flowforge.sdk import run_parameters, task_config; "
    "print(json.dumps({'config': task_config(), 'parameters': run_parameters()}))"
)
_ANNOTATION_FIELD = re.compile(r"metadata\.annotations\['([^']+)'\]")


def run_files_volume(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The Pod's volume of the run files (there is exactly one)."""
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == VOLUME_NAME]
    return dict(volume)


def project(
    volume: Mapping[str, Any],
    *,
    into: Path,
    config_map: Mapping[str, Any] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
) -> None:
    """What the kubelet writes for the volume: the ConfigMap's keys its ``items`` select, or
    the Pod annotations its downward API ``items`` name (only those files)."""
    into.mkdir(parents=True)
    if "configMap" in volume:
        assert config_map is not None, "the volume mounts a ConfigMap"
        for item in volume["configMap"]["items"]:
            (into / item["path"]).write_text(config_map["data"][item["key"]], encoding="utf-8")
        return
    for item in volume["downwardAPI"]["items"]:
        found = _ANNOTATION_FIELD.fullmatch(item["fieldRef"]["fieldPath"])
        assert found is not None, item
        text = (pod_annotations or {})[found.group(1)]
        (into / item["path"]).write_text(text, encoding="utf-8")


def read_as_the_task(env: Mapping[str, str], *, files: Path) -> dict[str, Any]:
    """``{"config": ..., "parameters": ...}`` as the SDK reads them in the container."""
    moved = {
        name: value.replace(MOUNT_PATH, str(files), 1) if value.startswith(MOUNT_PATH) else value
        for name, value in env.items()
    }
    result = subprocess.run(
        [sys.executable, "-c", READ_FILES], env=moved, capture_output=True, text=True, check=True
    )
    read: dict[str, Any] = json.loads(result.stdout)
    return read
