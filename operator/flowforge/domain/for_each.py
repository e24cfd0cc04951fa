"""A task's ``forEach``: one task instance per item, each with its own attempts and Job.

``forEach.items`` is a CEL expression over ``params`` that gives a list (bounded and
type-checked like a ``when``, `conditions.py`), or a literal list. When a run is created,
``expansion.expand`` evaluates it and the run gets one instance per item, keyed
``<task>[<item key>]``: a task key is a DNS-1123 label, so the bracket tells an instance
from a task and names its task (``DefinitionSpec.task_of``). The item key is stable: the
item itself when it is a short DNS-safe string (or a non-negative integer), else ``h-`` and
a short hash of its JSON; ``forEach.key`` names the field of object items that names them.
Two items with the same key are refused, naming the field.

An instance carries its item to its container as ``FLOWFORGE_ITEM`` (JSON) and
``FLOWFORGE_ITEM_KEY``, and in the run's files (`run_files.py`). At most
``maxParallel`` instances of one task run at once (the store's dispatch); dependents of the
task wait for every instance; ``tolerateFailures`` (a count, or a percent of the items,
rounded down) failed instances still let the task count as succeeded; a compensator of the
task runs once per instance that succeeded, with its item.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from flowforge.domain.caps import (
    MAX_ITEM_BYTES,
    MAX_ITEMS_PER_TASK,
    MAX_ITEMS_TOTAL_BYTES,
    MAX_TASKS,
)
from flowforge.domain.conditions import ConditionError, unknown_parameters, value_of
from flowforge.domain.errors import DefinitionError, DefinitionSchemaError
from flowforge.domain.parameters import sample_values

if TYPE_CHECKING:
    from flowforge.domain.models import DefinitionSpec, ForEachSpec, TaskSpec

MAX_ITEM_KEY_LENGTH: Final = 32
ITEM_ENV: Final = "FLOWFORGE_ITEM"
ITEM_KEY_ENV: Final = "FLOWFORGE_ITEM_KEY"
PARTIAL_FAILURE: Final = "PartialFailure"
NO_ITEMS: Final = "NoItems"
# what a forEach task whose list is empty records: skipped, like a false condition
NO_ITEMS_MESSAGE: Final = f"{NO_ITEMS}: forEach gave no items"

_PLAIN_ITEM_KEY = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PERCENT = re.compile(r"([0-9]{1,3})%")
# json.dumps with sort_keys builds a new encoder per call: one shared, as a run of a
# 200-item forEach encodes every item; a string item (the usual list) is encoded directly,
# as the encoder itself would. ASCII either way, so a text's length is its size in bytes
_ITEM_ENCODER: Final = json.JSONEncoder(sort_keys=True)
_encode_string: Final[Callable[[str], str]] = encode_basestring_ascii


class ItemsError(ConditionError):
    """A ``forEach`` whose items cannot be expanded: ``path`` names the field."""


class Instance(NamedTuple):
    """One item of a ``forEach`` task, as a task of the run (a tuple: a run of a 200-item
    forEach makes 200 of them while it is created)."""

    key: str  # ``<task>[<item key>]``
    task: str  # the forEach task's key (the group)
    item_key: str
    item: Any
    position: int  # the item's index in the list
    item_json: str  # the item as FLOWFORGE_ITEM holds it (`item_text`)


def instance_key(task: str, item_key: str) -> str:
    return f"{task}[{item_key}]"


def is_instance(key: str) -> bool:
    return key.endswith("]") and "[" in key


def split_instance(key: str) -> tuple[str, str | None]:
    """``(task, item key)`` of a run's task key; ``(key, None)`` for a plain task."""
    if not is_instance(key):
        return key, None
    task, _, rest = key.partition("[")
    return task, rest[:-1]


def item_text(item: Any) -> str:
    """An item exactly as ``FLOWFORGE_ITEM`` holds it (JSON, ASCII, sorted keys)."""
    if type(item) is str:
        return _encode_string(item)
    return _ITEM_ENCODER.encode(item)


def item_key(item: Any) -> str:
    """The stable key of an item (see the module)."""
    if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
        text = str(item)
    elif isinstance(item, str):
        text = item
    else:
        text = ""
    if len(text) <= MAX_ITEM_KEY_LENGTH and _PLAIN_ITEM_KEY.fullmatch(text):
        return text
    return "h-" + hashlib.sha256(item_text(item).encode()).hexdigest()[:12]


def tolerated_failures(for_each: ForEachSpec, items: int) -> int:
    """How many of ``items`` instances may fail with the task still succeeding."""
    tolerance = for_each.tolerate_failures
    if isinstance(tolerance, int):
        return tolerance
    match = _PERCENT.fullmatch(tolerance)
    return 0 if match is None else items * int(match.group(1)) // 100


def _items_path(index: int) -> str:
    return f"spec.tasks[{index}].forEach.items"


def items_of(task: TaskSpec, values: Mapping[str, Any], *, index: int) -> list[Any]:
    """The list ``task``'s forEach gives for the run's effective parameters."""
    assert task.for_each is not None
    path = _items_path(index)
    items = task.for_each.items
    found = value_of(items, values, path=path) if isinstance(items, str) else list(items)
    if not isinstance(found, list | tuple):
        raise ItemsError(f"must be a list, is {type(found).__name__} ({found!r})", path=path)
    return list(found)


def instances(
    task: TaskSpec, values: Mapping[str, Any], *, index: int, cap: int = MAX_ITEMS_PER_TASK
) -> tuple[Instance, ...]:
    """The instances of ``task`` (its forEach) for the run's effective parameters, in item
    order; ItemsError naming the field for too many items, an item too large, an object
    item without its key field, or two items with one key."""
    assert task.for_each is not None
    path = _items_path(index)
    items = items_of(task, values, index=index)
    if len(items) > cap:
        raise ItemsError(f"gives {len(items)} items; at most {cap} per task", path=path)
    field = task.for_each.key
    made: list[Instance] = []
    seen: dict[str, int] = {}
    for position, item in enumerate(items):
        text = item_text(item)
        size = len(text)
        if size > MAX_ITEM_BYTES:
            raise ItemsError(
                f"item {position} is {size} bytes as JSON; at most {MAX_ITEM_BYTES}", path=path
            )
        named = item
        if field is not None:
            if not isinstance(item, Mapping) or field not in item:
                raise ItemsError(
                    f"item {position} has no field {field!r} (spec.tasks[{index}].forEach.key)",
                    path=path,
                )
            named = item[field]
        key = item_key(named)
        if key in seen:
            raise ItemsError(
                f"items {seen[key]} and {position} have the same key {key!r}; item keys must be "
                "unique" + ("" if field is None else f" (forEach.key {field!r})"),
                path=path,
            )
        seen[key] = position
        made.append(Instance(instance_key(task.key, key), task.key, key, item, position, text))
    return tuple(made)


def check_total(groups: Sequence[tuple[int, tuple[Instance, ...]]], *, tasks: int) -> None:
    """The run's caps over all its instances: the 10,000-task cap and the items' bytes.
    ``groups``: (task index, instances) of each forEach task; ``tasks``: the run's other
    rows (plain tasks and compensators)."""
    total = tasks
    size = 0
    for index, made in groups:
        total += len(made)
        size += sum(len(instance.item_json) for instance in made)
        if total > MAX_TASKS:
            raise ItemsError(
                f"the run would have {total} or more tasks; at most {MAX_TASKS}",
                path=_items_path(index),
            )
        if size > MAX_ITEMS_TOTAL_BYTES:
            raise ItemsError(
                f"the run's items take {size} bytes or more as JSON; at most "
                f"{MAX_ITEMS_TOTAL_BYTES}",
                path=_items_path(index),
            )


def for_each_errors(definition: DefinitionSpec) -> list[DefinitionError]:
    """Every ``forEach`` checked offline (for a spec whose shape and parameter declarations
    are valid): not on a compensator; a literal list within the caps (and its keys unique);
    an expression bounded, naming only declared parameters, and a list on typed samples."""
    errors: list[DefinitionError] = []
    declared = {declaration.name for declaration in definition.parameters}
    samples: list[dict[str, Any]] | None = None
    for index, task in enumerate(definition.tasks):
        if task.for_each is None:
            continue
        path = f"spec.tasks[{index}].forEach"
        if task.compensate_for is not None:
            errors.append(
                DefinitionSchemaError(
                    "a compensation task runs once per item of its task's forEach; it takes "
                    "no forEach of its own",
                    path=path,
                )
            )
            continue
        items = task.for_each.items
        if not isinstance(items, str | list | tuple):
            errors.append(
                DefinitionSchemaError(
                    f"must be a CEL expression (a string) or a list, is {type(items).__name__}",
                    path=path + ".items",
                )
            )
            continue
        try:
            if not isinstance(items, str):
                instances(task, {}, index=index)
                continue
            unknown = unknown_parameters(items, declared, path=path + ".items")
            if unknown is not None:
                errors.append(unknown)
                continue
            if samples is None:
                samples = sample_values(definition)
            for values in samples:
                items_of(task, values, index=index)
        except ConditionError as error:
            errors.append(DefinitionSchemaError(error.message, path=error.path))
    return errors
