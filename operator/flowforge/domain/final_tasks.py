"""``finally``: tasks that run once a run's outcome is decided.

```yaml
spec:
  tasks: [...]
  finally:
    - {key: notify, type: py, retries: 2, timeoutSeconds: 60}
    - {key: release-lock, type: py}
```

When the forward tasks are resolved and the rollback (if any) has settled, the run's phase
is decided (``Succeeded``, ``Failed`` or ``Cancelled``) but not yet written: the run stays
``Running`` (``Reconciling`` reason ``Finalizing``) while its ``finally`` tasks run, in
list order, one at a time, each with its own retries and ``timeoutSeconds`` (the run has
no deadline that could cut them short). Each learns the outcome from its environment
(:data:`RUN_OUTCOME_ENV`, :data:`ROLLBACK_ENV`). A failing ``finally`` task is recorded
and the next one still runs; none of them changes the decided phase, which the run takes
once the last has run. A cancel asked while they run changes nothing (the outcome was
decided); a WorkflowRun object that is gone skips those not yet run.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from flowforge.domain.errors import (
    DefinitionError,
    DefinitionSchemaError,
    DuplicateTaskKeyError,
    UnknownTaskTypeError,
)
from flowforge.domain.models import DefinitionSpec

RUN_OUTCOME_ENV: Final = "FLOWFORGE_RUN_OUTCOME"
ROLLBACK_ENV: Final = "FLOWFORGE_ROLLBACK"

# what only a task of the DAG may have (a ``finally`` task runs alone, after it)
_DAG_FIELDS: Final = (
    ("depends_on", "dependsOn"),
    ("compensate_for", "compensateFor"),
    ("compensate_on", "compensateOn"),
    ("when", "when"),
    ("for_each", "forEach"),
    ("approval", "approval"),
)


class RollbackOutcome(StrEnum):
    """How the rollback ended, as a ``finally`` task is told (``FLOWFORGE_ROLLBACK``)."""

    NONE = "None"  # nothing was rolled back
    COMPLETED = "Completed"
    HALTED = "Halted"  # a compensator failed for good


def final_task_errors(definition: DefinitionSpec) -> list[DefinitionError]:
    """The ``finally`` rules, in list order: a key unique among all the tasks, a type of
    ``taskTypes``, and none of the fields only a task of the DAG has."""
    errors: list[DefinitionError] = []
    seen = {task.key for task in definition.tasks}
    for index, task in enumerate(definition.finally_tasks):
        where = f"spec.finally[{index}]"
        if task.key in seen:
            errors.append(
                DuplicateTaskKeyError(
                    f'duplicate task key "{task.key}": keys are unique among tasks and finally',
                    path=f"{where}.key",
                )
            )
        seen.add(task.key)
        if task.type is None or task.type not in definition.task_types:
            known = ", ".join(sorted(definition.task_types)) or "none"
            errors.append(
                UnknownTaskTypeError(
                    f'finally task "{task.key}" needs a type of taskTypes (declared: {known})',
                    path=f"{where}.type",
                )
            )
        for attribute, field in _DAG_FIELDS:
            if getattr(task, attribute):
                errors.append(
                    DefinitionSchemaError(
                        f'finally task "{task.key}" runs after the DAG, alone: {field} belongs '
                        "to a task of spec.tasks",
                        path=f"{where}.{field}",
                    )
                )
    return errors
