"""Generate the Pod-spec parts of a task type's schema from Kubernetes' own OpenAPI.

A task type names Pod and container fields in Kubernetes' own shape (``env`` with
``valueFrom``, ``volumes``, ``securityContext``, ``affinity``...). Their schemas are not
written by hand: this module reads the OpenAPI v3 document that ``k8s.io/kubernetes`` publishes
(``api/openapi-spec/v3/api__v1_openapi.json``) for the version pinned in
``deploy/local/versions.env``, keeps the fields FlowForge supports, inlines every ``$ref``
(the domain's schema, like a CRD's, has none), bounds every string, list and map (the
apiserver's CEL cost estimate and our caps need bounds), adds what the OpenAPI only says in
prose (enums, name grammars, the quantity grammar) and writes
``operator/flowforge/domain/podspec_schema.py``.

    python -m flowforge.kube.podspec_gen [--check] [--openapi FILE]

Without ``--openapi`` the document comes from the Go module cache (``go mod download`` of
``k8s.io/kubernetes`` at the pinned version fetches it through the module proxy when absent).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from flowforge.domain.k8s_grammar import (
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    LABEL_VALUE_PATTERN,
    NON_BLANK_PATTERN,
    QUANTITY_PATTERN,
)

Schema = dict[str, Any]

_CORE: Final = "io.k8s.api.core.v1."
_META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1."
_QUANTITY_REF: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING_REF: Final = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_OPENAPI_PATH: Final = "api/openapi-spec/v3/api__v1_openapi.json"

# Template field -> (definition, property) it is taken from. Container fields apply to the
# task's container; pod fields to its Pod (``podSecurityContext`` is PodSpec.securityContext).
TEMPLATE_FIELDS: Final[dict[str, tuple[str, str]]] = {
    "env": ("Container", "env"),
    "envFrom": ("Container", "envFrom"),
    "volumeMounts": ("Container", "volumeMounts"),
    "imagePullPolicy": ("Container", "imagePullPolicy"),
    "workingDir": ("Container", "workingDir"),
    "securityContext": ("Container", "securityContext"),
    "resources": ("Container", "resources"),
    "tolerations": ("PodSpec", "tolerations"),
    "volumes": ("PodSpec", "volumes"),
    "imagePullSecrets": ("PodSpec", "imagePullSecrets"),
    "affinity": ("PodSpec", "affinity"),
    "topologySpreadConstraints": ("PodSpec", "topologySpreadConstraints"),
    "priorityClassName": ("PodSpec", "priorityClassName"),
    "runtimeClassName": ("PodSpec", "runtimeClassName"),
    "podSecurityContext": ("PodSpec", "securityContext"),
    "initContainers": ("PodSpec", "initContainers"),
    "hostNetwork": ("PodSpec", "hostNetwork"),
    "hostPID": ("PodSpec", "hostPID"),
    "hostIPC": ("PodSpec", "hostIPC"),
}

# The properties kept of a definition; one not listed keeps all of its own. Left out: fields
# behind alpha feature gates of the pinned version (the apiserver would drop them silently),
# volume types other than these, and container fields a Job's sidecar does not need.
KEPT_PROPERTIES: Final[dict[str, tuple[str, ...]]] = {
    _CORE + "Container": (
        "name",
        "image",
        "command",
        "args",
        "env",
        "envFrom",
        "volumeMounts",
        "resources",
        "securityContext",
        "workingDir",
        "imagePullPolicy",
        "restartPolicy",
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
    ),
    _CORE + "EnvVarSource": ("configMapKeyRef", "fieldRef", "resourceFieldRef", "secretKeyRef"),
    _CORE + "Volume": (
        "name",
        "configMap",
        "secret",
        "persistentVolumeClaim",
        "emptyDir",
        "projected",
        "ephemeral",
        "downwardAPI",
        "hostPath",
    ),
    _CORE + "VolumeProjection": ("configMap", "secret", "downwardAPI", "serviceAccountToken"),
    _CORE + "ResourceRequirements": ("limits", "requests"),
    _CORE + "PersistentVolumeClaimSpec": (
        "accessModes",
        "resources",
        "selector",
        "storageClassName",
        "volumeMode",
        "volumeName",
        "dataSource",
        "dataSourceRef",
    ),
    _META + "ObjectMeta": ("labels", "annotations"),
}

# What the OpenAPI document says only in prose: (definition, property) -> keywords.
_ENUMS: Final[dict[tuple[str, str], list[str]]] = {
    ("Container", "imagePullPolicy"): ["Always", "IfNotPresent", "Never"],
    ("Container", "restartPolicy"): ["Always"],
    ("Toleration", "operator"): ["Exists", "Equal"],
    ("Toleration", "effect"): ["", "NoSchedule", "PreferNoSchedule", "NoExecute"],
    ("TopologySpreadConstraint", "whenUnsatisfiable"): ["DoNotSchedule", "ScheduleAnyway"],
    ("TopologySpreadConstraint", "nodeAffinityPolicy"): ["Honor", "Ignore"],
    ("TopologySpreadConstraint", "nodeTaintsPolicy"): ["Honor", "Ignore"],
    ("NodeSelectorRequirement", "operator"): ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"],
    ("LabelSelectorRequirement", "operator"): ["In", "NotIn", "Exists", "DoesNotExist"],
    ("SeccompProfile", "type"): ["RuntimeDefault", "Unconfined", "Localhost"],
    ("AppArmorProfile", "type"): ["RuntimeDefault", "Unconfined", "Localhost"],
    ("SecurityContext", "procMount"): ["Default", "Unmasked"],
    ("PersistentVolumeClaimSpec", "volumeMode"): ["Filesystem", "Block"],
    ("VolumeMount", "mountPropagation"): ["None", "HostToContainer", "Bidirectional"],
    ("VolumeMount", "recursiveReadOnly"): ["Disabled", "IfPossible", "Enabled"],
    ("PodSecurityContext", "fsGroupChangePolicy"): ["OnRootMismatch", "Always"],
    ("PodSecurityContext", "seLinuxChangePolicy"): ["MountOption", "Recursive"],
    ("PodSecurityContext", "supplementalGroupsPolicy"): ["Merge", "Strict"],
    ("HTTPGetAction", "scheme"): ["HTTP", "HTTPS"],
    (
        "HostPathVolumeSource",
        "type",
    ): [
        "",
        "DirectoryOrCreate",
        "Directory",
        "FileOrCreate",
        "File",
        "Socket",
        "CharDevice",
        "BlockDevice",
    ],
}
_PATTERNS: Final[dict[tuple[str, str], tuple[str, int]]] = {
    ("EnvVar", "name"): (ENV_NAME_PATTERN, 4096),
    ("Container", "name"): (DNS1123_LABEL_PATTERN, 63),
    ("Container", "image"): (NON_BLANK_PATTERN, 1024),
    ("Volume", "name"): (DNS1123_LABEL_PATTERN, 63),
    ("VolumeMount", "name"): (DNS1123_LABEL_PATTERN, 63),
    ("PodSpec", "priorityClassName"): (DNS1123_SUBDOMAIN_PATTERN, 253),
    ("PodSpec", "runtimeClassName"): (DNS1123_SUBDOMAIN_PATTERN, 253),
    ("LocalObjectReference", "name"): (DNS1123_SUBDOMAIN_PATTERN, 253),
}
_ID: Final = (0, 2**31 - 1)
_MODE: Final = (0, 0o777)
_RANGES: Final[dict[tuple[str, str], tuple[int, int]]] = {
    ("SecurityContext", "runAsUser"): _ID,
    ("SecurityContext", "runAsGroup"): _ID,
    ("PodSecurityContext", "runAsUser"): _ID,
    ("PodSecurityContext", "runAsGroup"): _ID,
    ("PodSecurityContext", "fsGroup"): _ID,
    ("PodSecurityContext", "supplementalGroups"): _ID,
    ("TopologySpreadConstraint", "maxSkew"): (1, 2**31 - 1),
    ("TopologySpreadConstraint", "minDomains"): (1, 2**31 - 1),
    ("WeightedPodAffinityTerm", "weight"): (1, 100),
    ("PreferredSchedulingTerm", "weight"): (1, 100),
    ("Probe", "initialDelaySeconds"): (0, 2**31 - 1),
    ("Probe", "periodSeconds"): (1, 2**31 - 1),
    ("Probe", "timeoutSeconds"): (1, 2**31 - 1),
    ("Probe", "successThreshold"): (1, 2**31 - 1),
    ("Probe", "failureThreshold"): (1, 2**31 - 1),
    ("Probe", "terminationGracePeriodSeconds"): (1, 2**31 - 1),
    ("ConfigMapVolumeSource", "defaultMode"): _MODE,
    ("SecretVolumeSource", "defaultMode"): _MODE,
    ("ProjectedVolumeSource", "defaultMode"): _MODE,
    ("DownwardAPIVolumeSource", "defaultMode"): _MODE,
    ("KeyToPath", "mode"): _MODE,
    ("DownwardAPIVolumeFile", "mode"): _MODE,
    ("ServiceAccountTokenProjection", "expirationSeconds"): (600, 2**32),
}
_REQUIRED: Final[dict[str, list[str]]] = {
    "Container": ["name", "image"],
    "LocalObjectReference": ["name"],
}
_LABEL_MAPS: Final = frozenset({("LabelSelector", "matchLabels"), ("ObjectMeta", "labels")})

MAX_STRING: Final = 4096
MAX_ITEMS: Final = 64
MAX_ENTRIES: Final = 64
_MAX_ITEMS_BY_FIELD: Final[dict[tuple[str, str], int]] = {
    ("Container", "env"): 256,
    ("Container", "command"): 256,
    ("Container", "args"): 256,
    ("ExecAction", "command"): 256,
}
# The apiserver reads a CRD's bounds as float64, and +-2**63 does not survive that: int64 fields
# are bounded to what a JSON number holds exactly.
_INT_BOUNDS: Final[dict[str, tuple[int, int]]] = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**53 - 1), 2**53 - 1),
}
_DESCRIPTION_CHARS: Final = 240
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]])\.\s")


class OpenApiError(ValueError):
    """The OpenAPI document lacks something this generator needs."""


def _summary(text: str) -> str:
    """The first sentence of a Kubernetes description, as kubectl explain's first line."""
    text = " ".join(text.split())
    match = _SENTENCE_END.search(text)
    first = text[: match.start() + 1] if match else text
    if len(first) > _DESCRIPTION_CHARS:
        first = first[: _DESCRIPTION_CHARS - 3].rstrip() + "..."
    return first


class _Generator:
    def __init__(self, definitions: Mapping[str, Schema]) -> None:
        self._definitions = definitions

    def definition(self, name: str, *, trail: tuple[str, ...]) -> Schema:
        if name in trail:
            raise OpenApiError(f"recursive definition {name}: {' -> '.join(trail)}")
        if name == _QUANTITY_REF:
            return {
                "anyOf": [
                    {"type": "integer"},
                    {"type": "string", "maxLength": 64, "pattern": QUANTITY_PATTERN},
                ],
                "x-kubernetes-int-or-string": True,
            }
        if name == _INT_OR_STRING_REF:
            return {
                "anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 253}],
                "x-kubernetes-int-or-string": True,
            }
        source = self._definitions.get(name)
        if source is None:
            raise OpenApiError(f"the OpenAPI document has no definition {name}")
        short = name.rsplit(".", 1)[-1]
        kept = KEPT_PROPERTIES.get(name)
        properties: Mapping[str, Schema] = source.get("properties", {})
        if kept is not None:
            missing = [field for field in kept if field not in properties]
            if missing:
                raise OpenApiError(f"{name} has no properties {missing}")
            properties = {field: properties[field] for field in kept}
        out: Schema = {"type": "object"}
        if source.get("description"):
            out["description"] = _summary(source["description"])
        out["additionalProperties"] = False
        required = _REQUIRED.get(short, [f for f in source.get("required", []) if f in properties])
        if required:
            out["required"] = list(required)
        out["properties"] = {
            field: self.property(short, field, schema, trail=(*trail, name))
            for field, schema in sorted(properties.items())
        }
        return out

    def property(self, owner: str, field: str, schema: Schema, *, trail: tuple[str, ...]) -> Schema:
        description = schema.get("description")
        out = self.value(schema, trail=trail, bound=(owner, field))
        if description:
            out = {"description": _summary(description), **out}
        key = (owner, field)
        if key in _ENUMS:
            out = {k: v for k, v in out.items() if k not in ("maxLength", "pattern")}
            out["enum"] = list(_ENUMS[key])
        if key in _PATTERNS:
            pattern, length = _PATTERNS[key]
            out.update({"minLength": 1, "maxLength": length, "pattern": pattern})
        if key in _RANGES:
            low, high = _RANGES[key]
            target = out["items"] if out.get("type") == "array" else out
            target.update({"minimum": low, "maximum": high})
        if key in _LABEL_MAPS:
            out["additionalProperties"] = {
                "type": "string",
                "maxLength": 63,
                "pattern": LABEL_VALUE_PATTERN,
            }
        return out

    def value(self, schema: Schema, *, trail: tuple[str, ...], bound: tuple[str, str]) -> Schema:
        reference = _reference(schema)
        if reference is not None:
            return self.definition(reference, trail=trail)
        kind = schema.get("type")
        if kind == "string":
            return {"type": "string", "maxLength": MAX_STRING}
        if kind == "integer":
            low, high = _INT_BOUNDS[schema.get("format", "int64")]
            return {"type": "integer", "minimum": low, "maximum": high}
        if kind == "boolean":
            return {"type": "boolean"}
        if kind == "array":
            return {
                "type": "array",
                "maxItems": _MAX_ITEMS_BY_FIELD.get(bound, MAX_ITEMS),
                "items": self.value(schema["items"], trail=trail, bound=bound),
            }
        if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
            return {
                "type": "object",
                "maxProperties": MAX_ENTRIES,
                "additionalProperties": self.value(
                    schema["additionalProperties"], trail=trail, bound=bound
                ),
            }
        raise OpenApiError(f"{'.'.join(bound)}: cannot translate {json.dumps(schema)[:200]}")


def _reference(schema: Schema) -> str | None:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    branches = schema.get("allOf")
    if isinstance(branches, list) and len(branches) == 1 and "$ref" in branches[0]:
        return str(branches[0]["$ref"]).rsplit("/", 1)[-1]
    return None


def template_fields(document: Mapping[str, Any]) -> dict[str, Schema]:
    """Template field name -> its JSON Schema, from the OpenAPI v3 document of core/v1."""
    definitions = document["components"]["schemas"]
    generator = _Generator(definitions)
    fields: dict[str, Schema] = {}
    for name, (owner, field) in TEMPLATE_FIELDS.items():
        source = definitions[_CORE + owner]["properties"].get(field)
        if source is None:
            raise OpenApiError(f"{owner} has no property {field}")
        fields[name] = generator.property(owner, field, source, trail=(_CORE + owner,))
    return fields


def _repository_root() -> Path:
    return Path(__file__).resolve().parents[3]


def default_target() -> Path:
    return _repository_root() / "operator" / "flowforge" / "domain" / "podspec_schema.py"


def pinned_kubernetes_version() -> str:
    versions = _repository_root() / "deploy" / "local" / "versions.env"
    for line in versions.read_text().splitlines():
        if line.startswith("KUBE_VERSION="):
            return line.partition("=")[2].strip()
    raise OpenApiError(f"{versions} pins no KUBE_VERSION")


def openapi_document(version: str) -> dict[str, Any]:
    """core/v1's OpenAPI v3 document from the module ``k8s.io/kubernetes@version``."""
    try:
        listing = subprocess.run(
            ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
    except FileNotFoundError as error:
        raise OpenApiError(
            "go is not installed: the OpenAPI document comes from the Go module k8s.io/kubernetes"
        ) from error
    except subprocess.CalledProcessError as error:
        raise OpenApiError(f"go mod download k8s.io/kubernetes@{version}: {error.stderr}") from None
    directory = Path(json.loads(listing.stdout)["Dir"])
    loaded: dict[str, Any] = json.loads((directory / _OPENAPI_PATH).read_text())
    return loaded


_QUOTES: Final = '"' * 3


def render(fields: Mapping[str, Schema], *, version: str) -> str:
    body = json.dumps(dict(fields), indent=1, ensure_ascii=True)
    if _QUOTES in body:
        raise OpenApiError("a description holds three quotes; the rendering cannot carry it")
    return (
        "# ruff: noqa: E501\n"
        f"{_QUOTES}Pod and container fields of a task type, from Kubernetes {version}'s "
        "OpenAPI.\n\n"
        "Generated by `python -m flowforge.kube.podspec_gen`; do not edit by hand.\n"
        f"{_QUOTES}\n\n"
        "import json\n"
        "from typing import Any, Final\n\n"
        f'KUBERNETES_VERSION: Final = "{version}"\n\n'
        "TEMPLATE_FIELDS: Final[dict[str, Any]] = json.loads(\n"
        f"    r{_QUOTES}{body}{_QUOTES}\n"
        ")\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flowforge.kube.podspec_gen", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--openapi", type=Path, help="api__v1_openapi.json to read")
    parser.add_argument("--out", type=Path, default=default_target())
    parser.add_argument("--check", action="store_true", help="exit 1 when --out is stale")
    options = parser.parse_args(argv)
    version = pinned_kubernetes_version()
    document = (
        json.loads(options.openapi.read_text()) if options.openapi else openapi_document(version)
    )
    text = render(template_fields(document), version=version)
    current = options.out.read_text() if options.out.exists() else None
    if current == text:
        return 0
    if options.check:
        print(f"out of date: {options.out}; run {parser.prog}", file=sys.stderr)
        return 1
    options.out.write_text(text)
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
