"""What a task type's Pod-spec fields may loosen, judged against a namespace policy.

Jobs start from restricted defaults (`flowforge.kube.jobs`); a template may lay its own
securityContext, host namespaces and volumes over them. Each loosening is refused unless the
policy's ``podSecurity`` allows it: privileged containers and privilege escalation, added
capabilities, hostNetwork/hostPID/hostIPC, hostPath volumes, running as root, unconfined
seccomp/AppArmor profiles, unmasked /proc, custom SELinux users, roles and types, sysctls, and
the runtime and priority classes named. A node affinity that requires node labels is held to
the policy's ``nodeSelector``, as a nodeSelector is.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from flowforge.domain.models import ContainerTemplate
from flowforge.domain.policy_spec import PodSecurityRules

ANY: Final = "*"
# SELinux types Pod Security `restricted` allows.
_CONTAINER_SELINUX_TYPES: Final = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)

Found = tuple[str, str]  # (field path, what is refused)


def _glob(value: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


def _containers(template: ContainerTemplate, path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, securityContext) of the task's container and of every init container."""
    yield path, template.security_context or {}
    for index, container in enumerate(template.init_containers or ()):
        yield f"{path}.initContainers[{index}]", container.get("securityContext") or {}


def _profiles(context: Mapping[str, Any], at: str, rules: PodSecurityRules) -> Iterator[Found]:
    """seccomp, AppArmor and SELinux settings of a Pod's or a container's securityContext."""
    if rules.unconfined:
        return
    for field in ("seccompProfile", "appArmorProfile"):
        if (context.get(field) or {}).get("type") == "Unconfined":
            yield f"{at}.{field}.type", "profile Unconfined"
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("user") or selinux.get("role"):
        yield f"{at}.seLinuxOptions", "a custom SELinux user or role"
    if selinux.get("type", "") not in _CONTAINER_SELINUX_TYPES:
        yield f"{at}.seLinuxOptions.type", f"SELinux type {selinux['type']!r}"


def _run_as(context: Mapping[str, Any], at: str, rules: PodSecurityRules) -> Iterator[Found]:
    if rules.run_as_root:
        return
    if context.get("runAsNonRoot") is False:
        yield f"{at}.runAsNonRoot", "running as root (runAsNonRoot: false)"
    if context.get("runAsUser") == 0:
        yield f"{at}.runAsUser", "running as user 0 (root)"


def _container_findings(
    context: Mapping[str, Any], at: str, rules: PodSecurityRules
) -> Iterator[Found]:
    at = f"{at}.securityContext"
    if context.get("privileged") is True and not rules.privileged:
        yield f"{at}.privileged", "a privileged container"
    if (context.get("windowsOptions") or {}).get("hostProcess") is True and not rules.privileged:
        yield f"{at}.windowsOptions.hostProcess", "a Windows host process"
    if context.get("allowPrivilegeEscalation") is True and not rules.allow_privilege_escalation:
        yield f"{at}.allowPrivilegeEscalation", "privilege escalation"
    for index, capability in enumerate((context.get("capabilities") or {}).get("add") or ()):
        if not _glob(str(capability), rules.capabilities):
            yield f"{at}.capabilities.add[{index}]", f"adding capability {capability}"
    if context.get("procMount") == "Unmasked" and not rules.unconfined:
        yield f"{at}.procMount", "procMount Unmasked"
    yield from _run_as(context, at, rules)
    yield from _profiles(context, at, rules)


def _host_path_allowed(path: str, allowed: Sequence[str]) -> bool:
    normal = posixpath.normpath(path)
    for prefix in allowed:
        root = posixpath.normpath(prefix)
        if normal == root or normal.startswith(root.rstrip("/") + "/"):
            return True
    return False


def _pod_findings(
    template: ContainerTemplate, path: str, rules: PodSecurityRules
) -> Iterator[Found]:
    if not rules.host_namespaces:
        for field, value in (
            ("hostNetwork", template.host_network),
            ("hostPID", template.host_pid),
            ("hostIPC", template.host_ipc),
        ):
            if value is True:
                yield f"{path}.{field}", f"the host's namespace ({field})"
    for index, volume in enumerate(template.volumes or ()):
        host_path = volume.get("hostPath")
        if host_path is not None and not _host_path_allowed(host_path["path"], rules.host_paths):
            yield f"{path}.volumes[{index}].hostPath", f"host path {host_path['path']}"
    pod = template.pod_security_context or {}
    at = f"{path}.podSecurityContext"
    yield from _run_as(pod, at, rules)
    yield from _profiles(pod, at, rules)
    for index, sysctl in enumerate(pod.get("sysctls") or ()):
        if not _glob(str(sysctl.get("name")), rules.sysctls):
            yield f"{at}.sysctls[{index}]", f"sysctl {sysctl.get('name')}"
    for field, name, allowed in (
        ("runtimeClassName", template.runtime_class_name, rules.runtime_classes),
        ("priorityClassName", template.priority_class_name, rules.priority_classes),
    ):
        if name is not None and not _glob(name, allowed):
            yield f"{path}.{field}", f"{field} {name!r}"


def pod_security_findings(
    template: ContainerTemplate, *, path: str, rules: PodSecurityRules
) -> list[Found]:
    """Every loosening of the restricted defaults ``rules`` do not allow, with its path."""
    found = list(_pod_findings(template, path, rules))
    for at, context in _containers(template, path):
        found.extend(_container_findings(context, at, rules))
    return found


def required_node_labels(template: ContainerTemplate, *, path: str) -> list[tuple[str, str, Any]]:
    """(path, label key, values or None) of each node-label requirement of the template's
    required node affinity: None when the operator is not In (any value may match)."""
    node = (template.affinity or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    found: list[tuple[str, str, Any]] = []
    base = f"{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    for term_index, term in enumerate(required.get("nodeSelectorTerms") or ()):
        for field in ("matchExpressions", "matchFields"):
            for index, expression in enumerate(term.get(field) or ()):
                at = f"{base}.nodeSelectorTerms[{term_index}].{field}[{index}]"
                values = expression.get("values") if expression.get("operator") == "In" else None
                found.append((at, str(expression.get("key")), values))
    return found
