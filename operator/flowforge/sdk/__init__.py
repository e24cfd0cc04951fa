"""Python constructors for FlowForge workflows: ``chain``, ``group`` and ``chord`` over one
DAG primitive, and ``workflow`` to turn a composition into a WorkflowDefinition document.

::

    from flowforge.sdk import chain, chord, group, task, workflow

    etl = workflow(
        "etl", 1,
        task_types={"py": {"image": "python:3.12-slim"}},
        body=chain(
            task("extract", "py"),
            chord(group(task("shard-1", "py"), task("shard-2", "py")), task("merge", "py")),
            task("load", "py", compensated_by=task("unload", "py")),
        ),
    )

``flowforge render module:attr`` prints such a document as YAML for a GitOps repository.
Inside a task's container, ``task_config()`` and ``run_parameters()`` read the task's config
and the run's parameters from the files FlowForge mounts, and ``task_item()`` the item of a
``forEach`` instance.
"""

from flowforge.domain.api import API_VERSION, DEFINITION_KIND
from flowforge.sdk.dag import CompositionError, Dag, TaskNode, chain, chord, group, task
from flowforge.sdk.manifest_yaml import to_yaml
from flowforge.sdk.task_inputs import run_parameters, task_config, task_item
from flowforge.sdk.workflow import workflow

__all__ = [
    "API_VERSION",
    "DEFINITION_KIND",
    "CompositionError",
    "Dag",
    "TaskNode",
    "chain",
    "chord",
    "group",
    "run_parameters",
    "task",
    "task_config",
    "task_item",
    "to_yaml",
    "workflow",
]
