"""What a task's own code reads: its config and the run's parameters, from the files
FlowForge mounts into its container (``$FLOWFORGE_CONFIG_FILE`` and
``$FLOWFORGE_PARAMETERS_FILE``, under ``/etc/flowforge``)::

    from flowforge.sdk import run_parameters, task_config

    source = task_config()["source"]
    date = run_parameters()["date"]
"""

from __future__ import annotations

import json
import os
from typing import Any

from flowforge.domain.for_each import ITEM_ENV
from flowforge.domain.run_files import (
    CONFIG_FILE_PATH,
    CONFIG_FILE_VARIABLE,
    PARAMETERS_FILE_PATH,
    PARAMETERS_FILE_VARIABLE,
)


def _read(variable: str, default: str) -> dict[str, Any]:
    with open(os.environ.get(variable) or default, encoding="utf-8") as file:
        document: dict[str, Any] = json.load(file)
    return document


def task_config() -> dict[str, Any]:
    """This task's ``config`` (``{}`` when the definition gives none)."""
    return _read(CONFIG_FILE_VARIABLE, CONFIG_FILE_PATH)


def task_item() -> Any:
    """The item of this ``forEach`` instance (``$FLOWFORGE_ITEM``, `docs/foreach.md`); None
    for a task that is no instance."""
    text = os.environ.get(ITEM_ENV)
    return None if text is None else json.loads(text)


def run_parameters() -> dict[str, str]:
    """The run's ``spec.parameters``."""
    return {
        str(name): str(value)
        for name, value in _read(PARAMETERS_FILE_VARIABLE, PARAMETERS_FILE_PATH).items()
    }
