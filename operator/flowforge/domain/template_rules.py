"""The rules of a task type's template that JSON Schema cannot say, as the apiserver has them.

The schema bounds every field and knows every grammar of a single value. What needs two
fields, or a key of a map (a structural schema has no ``propertyNames``), or a sum, is here:
label and annotation keys, the 256 KiB of annotations an object may carry, tolerations
(``Exists`` takes no value; an empty key needs ``Exists``; ``tolerationSeconds`` only with
``NoExecute``), an env entry with both ``value`` and ``valueFrom``, volume and container names
that clash, mounts of volumes that do not exist, FlowForge's own volume and mount path
(`flowforge.domain.run_files`), and the task container's env names of the run's parameters
(``FLOWFORGE_PARAM_*``, also as an ``envFrom`` prefix): FlowForge sets those from the run, so
a run's author could otherwise replace a value the template's author set (a ``secretKeyRef``
included). Refusing the definition is safer than letting either side win silently: the
template's author learns at ``kubectl apply``, no run can shadow a secret, and a definition
published before this rule fails its re-validation on load instead of running with the
parameter in place of the secret. Whatever is left, the apiserver's dry-run in admission
answers (`flowforge.admission.dryrun`).

Runs on a spec whose shape is valid; paths are rendered by `schema.format_path`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from flowforge.domain.caps import PARAMETER_ENV_PREFIX
from flowforge.domain.k8s_grammar import qualified_name_problem
from flowforge.domain.run_files import MOUNT_PATH, VOLUME_NAME, reserved_mount_path

PathPart = str | int
Problem = tuple[tuple[PathPart, ...], str]

# k8s.io/apimachinery's TotalAnnotationSizeLimitB: keys and values of one object together.
MAX_ANNOTATION_BYTES: Final = 256 * 1024
# Reserved for FlowForge's own container of the Job.
TASK_CONTAINER_NAME: Final = "task"


def template_problems(spec: Mapping[str, Any]) -> list[Problem]:
    """Every problem of every task type's template of a shape-valid ``spec``."""
    problems: list[Problem] = []
    for name, template in sorted((spec.get("taskTypes") or {}).items()):
        problems.extend(_template(template, ("taskTypes", name)))
    return problems


def _template(template: Mapping[str, Any], at: tuple[PathPart, ...]) -> Iterator[Problem]:
    yield from _keys(template.get("labels"), (*at, "labels"))
    yield from _keys(template.get("nodeSelector"), (*at, "nodeSelector"))
    yield from _annotations(template.get("annotations"), (*at, "annotations"))
    job = template.get("jobMetadata") or {}
    yield from _keys(job.get("labels"), (*at, "jobMetadata", "labels"))
    yield from _annotations(job.get("annotations"), (*at, "jobMetadata", "annotations"))
    for index, toleration in enumerate(template.get("tolerations") or ()):
        yield from _toleration(toleration, (*at, "tolerations", index))
    volumes = template.get("volumes") or ()
    yield from _duplicates([volume["name"] for volume in volumes], (*at, "volumes"), "volume")
    for index, volume in enumerate(volumes):
        if volume["name"] == VOLUME_NAME:
            yield (*at, "volumes", index, "name"), f"{VOLUME_NAME!r} is the run's files' volume"
    volume_names = {volume["name"] for volume in volumes}
    yield from _container(template, at, volume_names=volume_names)
    yield from _parameter_names(template, at)
    for index, mount in enumerate(template.get("volumeMounts") or ()):
        if reserved_mount_path(mount["mountPath"]):
            yield (
                (*at, "volumeMounts", index, "mountPath"),
                f"{MOUNT_PATH} is where the task finds its config and parameters; mount elsewhere",
            )
    sidecars = template.get("initContainers") or ()
    names = [container["name"] for container in sidecars]
    yield from _duplicates(names, (*at, "initContainers"), "container")
    for index, container in enumerate(sidecars):
        where = (*at, "initContainers", index)
        if container["name"] == TASK_CONTAINER_NAME:
            yield (
                (*where, "name"),
                f"{TASK_CONTAINER_NAME!r} is the name of the task's own container",
            )
        yield from _container(container, where, volume_names=volume_names)


def _keys(mapping: Mapping[str, Any] | None, at: tuple[PathPart, ...]) -> Iterator[Problem]:
    for key in sorted(mapping or {}):
        problem = qualified_name_problem(key)
        if problem is not None:
            yield (*at, key), f"key {key[:60]!r} {problem}"


def _annotations(
    annotations: Mapping[str, str] | None, at: tuple[PathPart, ...]
) -> Iterator[Problem]:
    yield from _keys(annotations, at)
    size = sum(
        len(key.encode()) + len(value.encode()) for key, value in (annotations or {}).items()
    )
    if size > MAX_ANNOTATION_BYTES:
        yield (
            at,
            (
                f"annotations take {size} bytes; Kubernetes allows at most {MAX_ANNOTATION_BYTES} "
                "(keys and values together)"
            ),
        )


def _toleration(toleration: Mapping[str, Any], at: tuple[PathPart, ...]) -> Iterator[Problem]:
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists" and toleration.get("value"):
        yield (*at, "value"), "must be empty when operator is Exists"
    if not toleration.get("key") and operator != "Exists":
        yield (*at, "operator"), "must be Exists when key is empty (that tolerates every taint)"
    if toleration.get("key"):
        problem = qualified_name_problem(toleration["key"])
        if problem is not None:
            yield (*at, "key"), problem
    if "tolerationSeconds" in toleration and toleration.get("effect") != "NoExecute":
        yield (*at, "tolerationSeconds"), "is allowed only with effect NoExecute"


def _container(
    container: Mapping[str, Any], at: tuple[PathPart, ...], *, volume_names: set[str]
) -> Iterator[Problem]:
    for index, entry in enumerate(container.get("env") or ()):
        if entry.get("value") and "valueFrom" in entry:
            yield (*at, "env", index, "valueFrom"), "may not be given with a non-empty value"
        sources = entry.get("valueFrom")
        if sources is not None and len(sources) != 1:
            yield (
                (*at, "env", index, "valueFrom"),
                (
                    "must name exactly one of configMapKeyRef, fieldRef, resourceFieldRef, "
                    "secretKeyRef"
                ),
            )
    mounts = container.get("volumeMounts") or ()
    for index, mount in enumerate(mounts):
        if mount["name"] not in volume_names:
            yield (
                (*at, "volumeMounts", index, "name"),
                (f"names volume {mount['name']!r}, which the task type's volumes do not declare"),
            )
    paths = [mount["mountPath"] for mount in mounts]
    yield from _duplicates(paths, (*at, "volumeMounts"), "mountPath", field="mountPath")


def _parameter_names(template: Mapping[str, Any], at: tuple[PathPart, ...]) -> Iterator[Problem]:
    """The task container's env may not name a run parameter's variable, which FlowForge
    sets from the run (`flowforge.kube.jobs`) and which would replace the template's."""
    reserved = f"{PARAMETER_ENV_PREFIX}* is where a run's parameters go; rename it"
    for index, entry in enumerate(template.get("env") or ()):
        if entry["name"].startswith(PARAMETER_ENV_PREFIX):
            yield (*at, "env", index, "name"), f"{entry['name'][:60]!r}: {reserved}"
    for index, source in enumerate(template.get("envFrom") or ()):
        if (source.get("prefix") or "").startswith(PARAMETER_ENV_PREFIX):
            yield (*at, "envFrom", index, "prefix"), f"{source['prefix'][:60]!r}: {reserved}"


def _duplicates(
    values: Sequence[str], at: tuple[PathPart, ...], what: str, *, field: str = "name"
) -> Iterator[Problem]:
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            yield (*at, index, field), f"{what} {value!r} is given twice"
        seen.add(value)
