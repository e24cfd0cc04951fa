"""What a run's ConfigMap holds, and which of its files each task's container sees.

A run's parameters and its tasks' configs reach the containers as files, not environment
strings: one ConfigMap per run (built by `flowforge.kube.config_map`) holds
``parameters.json`` and one key per distinct task config, and each task's Job mounts only
``parameters.json`` and its own config (as ``config.json``) read-only at ``MOUNT_PATH``.
Tasks without a config share one key holding ``{}``, so a 10,000-task definition with few
configs stays small. Keys are collision-free by construction: a task key that is a DNS-1123
label (what validation allows; labels have no dots) gives ``config.<key>.json``, anything
else ``config.sha256.<hex>.json``, which has one dot more than any plain key, and the two
fixed keys have no ``config.`` prefix.

A Job whose two files are both ``{}`` (the run has no parameters, the task no config and no
items) and that is not created suspended needs no ConfigMap (`mounts_config_map`): its
volume, of the same name at the same path, is a downward API volume that writes the same
two files from its Pod's own annotation ``EMPTY_FILE_ANNOTATION`` (``{}``), part of the
Job's Pod template, which nobody can change once the Job runs. A suspended (Kueue) Job keeps
the ConfigMap: while suspended and never started, its template's annotations may be edited.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

PARAMETERS_KEY: Final = "parameters.json"
EMPTY_CONFIG_KEY: Final = "empty-config.json"
CONFIG_FILE: Final = "config.json"
PARAMETERS_FILE: Final = "parameters.json"
# Where every task container finds the files; the template rules keep it FlowForge's own.
MOUNT_PATH: Final = "/etc/flowforge"
VOLUME_NAME: Final = "flowforge-run-files"
CONFIG_FILE_VARIABLE: Final = "FLOWFORGE_CONFIG_FILE"
PARAMETERS_FILE_VARIABLE: Final = "FLOWFORGE_PARAMETERS_FILE"
CONFIG_FILE_PATH: Final = f"{MOUNT_PATH}/{CONFIG_FILE}"
# a forEach instance's (`for_each.py`) view of its task's items: {item key: item}
ITEMS_FILE: Final = "items.json"
ITEMS_FILE_VARIABLE: Final = "FLOWFORGE_ITEMS_FILE"
ITEMS_FILE_PATH: Final = f"{MOUNT_PATH}/{ITEMS_FILE}"
PARAMETERS_FILE_PATH: Final = f"{MOUNT_PATH}/{PARAMETERS_FILE}"
# the Pod annotation a Job without a ConfigMap reads both its files from (``{}``)
EMPTY_FILE_ANNOTATION: Final = "flowforge.io/empty-file"

_PLAIN_TASK_KEY = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def config_text(config: Mapping[str, Any]) -> str:
    """A task's config exactly as its ``config.json`` holds it (JSON, ASCII)."""
    return json.dumps(dict(config), sort_keys=True)


def parameters_text(parameters: Mapping[str, Any]) -> str:
    """The run's parameters exactly as ``parameters.json`` holds them."""
    return json.dumps(dict(parameters), sort_keys=True)


def config_key(task_key: str) -> str:
    """The ConfigMap key of the (non-empty) config of task ``task_key``."""
    if _PLAIN_TASK_KEY.fullmatch(task_key):
        return f"config.{task_key}.json"
    return f"config.sha256.{hashlib.sha256(task_key.encode()).hexdigest()}.json"


def task_config_key(task_key: str, config: Mapping[str, Any]) -> str:
    """The key a task's ``config.json`` is read from: its own, or the shared empty one."""
    return config_key(task_key) if config else EMPTY_CONFIG_KEY


def config_entry_bytes(task_key: str, text: str) -> int:
    """What one task's config adds to the ConfigMap (the apiserver counts keys and values)."""
    return len(config_key(task_key)) + len(text.encode())


def items_key(group: str) -> str:
    """The ConfigMap key of the items of the forEach task ``group`` (a task key)."""
    return f"items.{group}.json"


def run_files_data(
    parameters: Mapping[str, Any],
    configs: Iterable[tuple[str, Mapping[str, Any]]],
    items: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """The ConfigMap's ``data``: the parameters, the empty config, each task's own config
    (``configs``: task key and config of every task of the definition) and each forEach
    task's items (``items``: task key -> {item key: item})."""
    data = {PARAMETERS_KEY: parameters_text(parameters), EMPTY_CONFIG_KEY: config_text({})}
    for task_key, config in configs:
        if config:
            data[config_key(task_key)] = config_text(config)
    for group, by_key in (items or {}).items():
        data[items_key(group)] = json.dumps(dict(by_key), sort_keys=True)
    return data


def task_items(
    task_key: str, config: Mapping[str, Any], *, item_group: str | None = None
) -> list[dict[str, str]]:
    """The ConfigMap volume's ``items`` for one task: its two files (and, for a forEach
    instance, its task's items), nothing else."""
    files = [
        {"key": PARAMETERS_KEY, "path": PARAMETERS_FILE},
        {"key": task_config_key(task_key, config), "path": CONFIG_FILE},
    ]
    if item_group is not None:
        files.append({"key": items_key(item_group), "path": ITEMS_FILE})
    return files


def mounts_config_map(
    *, parameters: Mapping[str, Any], config: Mapping[str, Any], has_items: bool, suspended: bool
) -> bool:
    """Whether a task's Job mounts the run's ConfigMap: when one of its files holds something
    of the run (parameters, its config, its task's items) or the Job is created suspended;
    else both files are ``{}`` from its Pod's annotation (`empty_file_items`)."""
    return bool(parameters) or bool(config) or has_items or suspended


def empty_file_items() -> list[dict[str, Any]]:
    """The downward API volume's ``items`` of a Job without a ConfigMap: its two files, each
    the Pod's ``EMPTY_FILE_ANNOTATION``."""
    field = {"fieldPath": f"metadata.annotations['{EMPTY_FILE_ANNOTATION}']"}
    return [
        {"path": PARAMETERS_FILE, "fieldRef": dict(field)},
        {"path": CONFIG_FILE, "fieldRef": dict(field)},
    ]


def file_environment() -> dict[str, str]:
    """The variables that tell a task's container where its files are."""
    return {CONFIG_FILE_VARIABLE: CONFIG_FILE_PATH, PARAMETERS_FILE_VARIABLE: PARAMETERS_FILE_PATH}


def reserved_mount_path(path: str) -> bool:
    """Whether a template's own mount at ``path`` would hide or sit inside the run's files."""
    normalized = "/" + posixpath.normpath("/" + path).lstrip("/")
    return normalized == MOUNT_PATH or normalized.startswith(MOUNT_PATH + "/")
