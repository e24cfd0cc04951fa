"""Which images a task type's Pod pulls, and whether a policy's registries allow them.

Every image of the Pod counts: the task's container and every init container, sidecars (init
containers with ``restartPolicy: Always``) included; a template has no other containers.
Images are read as the kubelet pulls them (``busybox`` is ``docker.io/library/busybox``); one
that is no valid reference is refused whenever the registries are limited.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from flowforge.domain.models import ContainerTemplate

ANY: Final = "*"

# A container image reference as the kubelet reads it (the distribution reference grammar).
_DOMAIN = (
    r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"(?::[0-9]+)?"
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_DEFAULT_REGISTRY: Final = "docker.io"


@dataclass(frozen=True)
class ImageReference:
    registry: str
    repository: str  # registry/path, without tag or digest


def parse_image(image: str) -> ImageReference | None:
    """The registry and repository of ``image``, normalised as the kubelet pulls it
    (``busybox`` is ``docker.io/library/busybox``); None when it is not a valid reference."""
    match = _IMAGE.fullmatch(image)
    if match is None:
        return None
    domain, path = match.group("domain"), match.group("path")
    if domain is not None and not ("." in domain or ":" in domain or domain == "localhost"):
        if domain != domain.lower():
            return None  # an upper-case first component is neither a host nor a path
        path, domain = f"{domain}/{path}", None
    registry = (domain or _DEFAULT_REGISTRY).lower()
    if registry == _DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    return ImageReference(registry=registry, repository=f"{registry}/{path}")


def registry_allowed(reference: ImageReference, patterns: Iterable[str]) -> bool:
    """A pattern without ``/`` matches the registry host, one with ``/`` the repository
    (``ghcr.io/acme/*``); globs as in fnmatch, case-insensitive for the host."""
    for pattern in patterns:
        lowered = pattern.lower() if "/" not in pattern else pattern
        subject = reference.repository if "/" in pattern else reference.registry
        if fnmatch.fnmatchcase(subject, lowered):
            return True
    return False


def template_images(template: ContainerTemplate, *, path: str) -> Iterator[tuple[str, object]]:
    """(field path, image) of every container of the task type's Pod: the task's own, then
    each init container (sidecars too) in order. An init container's image is whatever its
    document holds (None when it names none)."""
    yield f"{path}.image", template.image
    for index, container in enumerate(template.init_containers or ()):
        yield f"{path}.initContainers[{index}].image", container.get("image")
