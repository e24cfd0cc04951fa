"""The size caps of every user input, in one place.

Parameters reach every Job of a run as ``FLOWFORGE_PARAM_<NAME>`` variables, and with the
tasks' configs as files of the run's ConfigMap (`flowforge.domain.run_files`): Linux refuses
to exec a process with one environment string over 128 KiB (MAX_ARG_STRLEN), and the
apiserver refuses a ConfigMap whose keys and values total over 1 MiB, so the caps keep both
well inside (16 KiB of parameters, even JSON-escaped twelve-fold, leave the configs' 768 KiB
room under 1 MiB). Configs nest at most ``MAX_CONFIG_DEPTH`` levels, so nothing recursive
(JSON encoders, the fingerprint, kopf's copies) ever meets a document deep enough to exhaust
the stack; the check that enforces it is iterative. A namespace policy may later lower (never
raise) these within the same hard limits; until then these values are the policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from flowforge.domain.run_files import config_entry_bytes
from flowforge.domain.run_files import config_text as config_text

MAX_TASKS: Final = 10_000
# dependsOn entries over all tasks: the graph, its Jobs' labels and the run's rows grow with it
MAX_EDGES: Final = 50_000
MAX_PARAMETERS: Final = 64
MAX_PARAMETER_NAME_LENGTH: Final = 128
MAX_PARAMETER_VALUE_LENGTH: Final = 4_096
MAX_PARAMETERS_TOTAL_LENGTH: Final = 16_384
# bytes of a task's config as its container receives it (config.json, JSON, ASCII)
MAX_CONFIG_BYTES: Final = 65_536
# bytes all of a definition's task configs take in a run's ConfigMap, keys included
MAX_CONFIGS_TOTAL_BYTES: Final = 786_432
# levels of nesting inside a config; the config object itself is level 1
MAX_CONFIG_DEPTH: Final = 32

# a forEach (flowforge.domain.for_each): items per task (the run's MAX_TASKS caps them all),
# the JSON of one item (an environment string of its container) and of all a run's items
# (files of its ConfigMap, beside the configs' and the parameters' room)
MAX_ITEMS_PER_TASK: Final = 256
MAX_ITEM_BYTES: Final = 4_096
MAX_ITEMS_TOTAL_BYTES: Final = 131_072

PARAMETER_ENV_PREFIX: Final = "FLOWFORGE_PARAM_"
_ENV_INVALID = re.compile(r"[^A-Z0-9_]+")


def parameter_env_name(name: str) -> str:
    """The environment variable that carries parameter ``name`` into a task's container."""
    return PARAMETER_ENV_PREFIX + _ENV_INVALID.sub("_", name.upper()).strip("_")


def nesting_depth(value: Any, *, limit: int) -> int:
    """How many levels of lists and objects ``value`` nests, counted iteratively.

    Stops counting once ``limit`` is exceeded (returns ``limit + 1``), so a hostile document
    costs no more than the part of it that is read.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterator[Any] = iter(item.values())
        elif isinstance(item, list | tuple):
            children = iter(item)
        else:
            continue
        if depth > limit:
            return limit + 1
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _json_length(value: Any) -> int:
    """A typed parameter's length: its JSON text (as a task reads it), or over the cap when
    it nests deeper than a config may or is no JSON at all."""
    if nesting_depth(value, limit=MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:
        return MAX_PARAMETER_VALUE_LENGTH + 1
    try:
        return len(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError):
        return MAX_PARAMETER_VALUE_LENGTH + 1


def parameter_errors(parameters: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field path, message) for every cap a run's parameters break; empty when they fit."""
    errors: list[tuple[str, str]] = []
    if len(parameters) > MAX_PARAMETERS:
        errors.append(
            (
                "spec.parameters",
                f"has {len(parameters)} parameters; at most {MAX_PARAMETERS} are allowed",
            )
        )
    total = 0
    seen: dict[str, str] = {}
    for name in sorted(parameters):
        value = parameters[name]
        path = f"spec.parameters[{name[:MAX_PARAMETER_NAME_LENGTH]}]"
        length = len(value) if isinstance(value, str) else _json_length(value)
        total += len(name) + length
        if len(name) > MAX_PARAMETER_NAME_LENGTH:
            errors.append((path, f"the name must be at most {MAX_PARAMETER_NAME_LENGTH} long"))
        if length > MAX_PARAMETER_VALUE_LENGTH:
            errors.append(
                (path, f"must be at most {MAX_PARAMETER_VALUE_LENGTH} characters (has {length})")
            )
        env_name = parameter_env_name(name)
        if env_name == PARAMETER_ENV_PREFIX:
            errors.append((path, "the name needs at least one letter or digit"))
        elif env_name in seen:
            errors.append(
                (
                    path,
                    f"parameters {seen[env_name]!r} and {name!r} would both be the "
                    f"environment variable {env_name}; rename one",
                )
            )
        else:
            seen[env_name] = name
    if total > MAX_PARAMETERS_TOTAL_LENGTH:
        errors.append(
            (
                "spec.parameters",
                f"names and values total {total} characters; at most "
                f"{MAX_PARAMETERS_TOTAL_LENGTH} are allowed",
            )
        )
    return errors


def config_errors(config: Any, *, path: str) -> list[tuple[str, str]]:
    """(field path, message) when a task's config nests too deeply or is too large."""
    return _config_size(config, path=path)[1]


def _config_size(config: Any, *, path: str) -> tuple[str | None, list[tuple[str, str]]]:
    """A config's text (None: empty or not a JSON object) and what its caps say of it."""
    if not isinstance(config, Mapping) or not config:
        return None, []
    depth = nesting_depth(config, limit=MAX_CONFIG_DEPTH)
    if depth > MAX_CONFIG_DEPTH:
        return None, [(path, f"nests more than {MAX_CONFIG_DEPTH} levels deep; flatten it")]
    try:
        text = config_text(config)
    except (TypeError, ValueError):
        return None, []  # not JSON: the shape check names the value
    if len(text) > MAX_CONFIG_BYTES:
        return text, [
            (
                path,
                f"is {len(text)} bytes as JSON; at most {MAX_CONFIG_BYTES} are allowed (keep "
                "large data in your own store and pass a reference)",
            )
        ]
    return text, []


def definition_cap_errors(spec: Any) -> list[tuple[str, str]]:
    """(field path, message) for the caps of a definition spec the JSON Schema cannot state."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("tasks"), list):
        return []
    errors: list[tuple[str, str]] = []
    edges = 0
    configs = 0
    finals = spec.get("finally")
    listed = [("tasks", task) for task in spec["tasks"]]
    listed += [("finally", task) for task in (finals if isinstance(finals, list) else [])]
    for index, (field, task) in enumerate(listed):
        if not isinstance(task, Mapping):
            continue
        where = f"spec.{field}[{index if field == 'tasks' else index - len(spec['tasks'])}]"
        depends_on = task.get("dependsOn")
        if isinstance(depends_on, list):
            edges += len(depends_on)
        text, problems = _config_size(task.get("config"), path=f"{where}.config")
        errors.extend(problems)
        if text is not None:
            configs += config_entry_bytes(str(task.get("key")), text)
    if configs > MAX_CONFIGS_TOTAL_BYTES:
        errors.append(
            (
                "spec.tasks",
                f"task configs total {configs} bytes in the run's ConfigMap (keys included); at "
                f"most {MAX_CONFIGS_TOTAL_BYTES} are allowed (keep large data in your own store "
                "and pass a reference)",
            )
        )
    if edges > MAX_EDGES:
        errors.append(
            (
                "spec.tasks",
                f"declare {edges} dependencies (dependsOn entries) in total; at most "
                f"{MAX_EDGES} are allowed",
            )
        )
    return errors
