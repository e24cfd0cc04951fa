"""Field paths of a task's Job (or its Pod) mapped back onto the task type's template.

The apiserver names the field it refuses in the object it was sent
(``spec.template.spec.containers[0].env[2].name``); the person who applied the definition
wrote ``spec.taskTypes[py].env[2].name``. `flowforge.kube.jobs` decides where each template
field lands, so the way back is next to it: the task's container is ``containers[0]`` (its
env entries shifted where FlowForge's own replace the template's), init containers and the
other Pod fields keep their names, the Pod's securityContext is ``podSecurityContext``, the
Pod template's labels and annotations are the template's, the Job's are ``jobMetadata``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

_POD_PREFIXES: Final = {"Job": "spec.template.", "Pod": ""}
_ENV_INDEX = re.compile(r"^env\[(\d+)\](.*)$", re.DOTALL)


def template_path(
    field: str, *, kind: str, template_path: str, env_positions: Sequence[int]
) -> str | None:
    """The template's path for the ``field`` the apiserver named in a ``kind`` (Job or Pod)
    built from it; None when the field is none of the template's (FlowForge's own)."""
    pod = _POD_PREFIXES[kind]
    if kind == "Job" and field.startswith("metadata."):
        rest = field.removeprefix("metadata.")
        if rest.startswith(("labels", "annotations")):
            return f"{template_path}.jobMetadata.{rest}"
        return None
    # a Pod template's metadata is named both spec.template.metadata.labels and
    # spec.template.labels by the apiserver
    for prefix in (f"{pod}metadata.", pod if kind == "Job" else "metadata."):
        if field.startswith(prefix) and field.removeprefix(prefix).startswith(
            ("labels", "annotations")
        ):
            return f"{template_path}.{field.removeprefix(prefix)}"
    spec = f"{pod}spec."
    if not field.startswith(spec):
        return None
    rest = field.removeprefix(spec)
    if rest.startswith("containers[0]"):
        inner = rest.removeprefix("containers[0]").removeprefix(".")
        match = _ENV_INDEX.match(inner)
        if match is not None:
            index = int(match.group(1))
            if index >= len(env_positions):
                return None  # one of FlowForge's identity variables
            inner = f"env[{env_positions[index]}]{match.group(2)}"
        return f"{template_path}.{inner}" if inner else template_path
    if rest.startswith("containers["):
        return None
    if rest == "securityContext" or rest.startswith(("securityContext.", "securityContext[")):
        return f"{template_path}.pod{rest[0].upper()}{rest[1:]}"
    return f"{template_path}.{rest}"
