"""The error tree's docstring lists every FlowForge exception, as it is."""

from __future__ import annotations

import importlib
import pkgutil

import flowforge
from flowforge.domain import errors
from flowforge.domain.errors import FlowForgeError, InfrastructureError, UserError


def _every_subclass(root: type[BaseException]) -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    stack = [root]
    while stack:
        for subclass in stack.pop().__subclasses__():
            if subclass not in found:
                found.add(subclass)
                stack.append(subclass)
    return found


def test_every_flowforge_exception_is_named_in_the_tree() -> None:
    for module in pkgutil.walk_packages(flowforge.__path__, prefix="flowforge."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    documented = errors.__doc__ or ""
    missing = sorted(
        cls.__name__ for cls in _every_subclass(FlowForgeError) if cls.__name__ not in documented
    )
    assert missing == []


def test_blame_and_retry_are_separate_questions() -> None:
    from flowforge.kube.errors import KubernetesRefusal, KubernetesUnavailable
    from flowforge.store.errors import StaleEpochError

    assert issubclass(KubernetesRefusal, UserError) and not KubernetesRefusal.retryable
    assert issubclass(StaleEpochError, InfrastructureError) and not StaleEpochError.retryable
    assert issubclass(KubernetesUnavailable, InfrastructureError)
