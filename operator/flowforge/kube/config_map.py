"""The ConfigMap of one run: its parameters and its tasks' configs, as files for the Jobs.

A pure function of the run and its definition (`flowforge.domain.run_files` decides the keys);
the run is its controller owner, so the garbage collector deletes it with the run. It is
immutable: once created nobody changes what a later attempt reads (it can only be deleted),
and the kubelets need not watch it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from flowforge.domain.execution import config_map_name
from flowforge.domain.run_files import run_files_data
from flowforge.kube.errors import KubernetesError
from flowforge.kube.jobs import (
    ANNOTATION_RUN_NAME,
    ANNOTATION_RUN_UID,
    LABEL_MANAGED_BY,
    LABEL_RUN,
    MANAGED_BY,
    JobIdentity,
    label_value,
    run_owner_reference,
)

# the apiserver answers a GET with this Accept header with the object's metadata only
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def build_config_map(
    *,
    namespace: str,
    run_name: str,
    run_uid: str,
    parameters: Mapping[str, Any],
    configs: Iterable[tuple[str, Mapping[str, Any]]],
    items: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The run's ConfigMap (``configs``: task key and config of each task of its definition;
    ``items``: each forEach task's items by key)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(run_name=run_name, run_uid=run_uid),
            "namespace": namespace,
            "labels": {
                LABEL_RUN: label_value(run_name),
                "app.kubernetes.io/name": "flowforge",
                "app.kubernetes.io/component": "run-files",
                LABEL_MANAGED_BY: MANAGED_BY,
                "app.kubernetes.io/instance": label_value(run_name),
            },
            "annotations": {ANNOTATION_RUN_UID: run_uid, ANNOTATION_RUN_NAME: run_name},
            "ownerReferences": [run_owner_reference(run_name=run_name, run_uid=run_uid)],
        },
        "immutable": True,
        "data": run_files_data(parameters, configs, items),
    }


@dataclass(frozen=True)
class ConfigMapFound:
    """The ConfigMap under a name after a creation: ``created`` by this call, or there
    already."""

    body: dict[str, Any]
    created: bool

    @property
    def uid(self) -> str | None:
        uid = (self.body.get("metadata") or {}).get("uid")
        return None if uid is None else str(uid)


def same_config_map(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether the ConfigMap found under the name is the one wanted: controlled by the same
    run, immutable, with the same data (anything else was put there by someone else)."""
    metadata = existing.get("metadata") or {}
    owner = JobIdentity.run_controller(metadata)
    wanted_owner = JobIdentity.run_controller(wanted["metadata"])
    return (
        owner == wanted_owner
        and existing.get("immutable") is True
        and (existing.get("data") or {}) == wanted["data"]
        and not existing.get("binaryData")
    )


class ConfigMapCalls:
    """`KubeClient`'s ConfigMap call (a mixin: it uses the client's API and threads)."""

    _core: k8s.CoreV1Api
    _call: Callable[..., Awaitable[bytes]]
    _call_critical: Callable[..., Awaitable[bytes]]

    async def create_config_map(self, manifest: Mapping[str, Any]) -> ConfigMapFound:
        """Create a ConfigMap; the one now under its name: the one created, or the one that
        already had the name (for the caller to judge, `same_config_map`)."""
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        for tries_left in (1, 0):
            try:
                response = await self._call_critical(
                    self._core.create_namespaced_config_map, namespace, manifest
                )
            except KubernetesError as error:
                if not error.conflict:
                    raise
            else:
                return ConfigMapFound(body=json.loads(response), created=True)
            try:
                body = await self._call(self._core.read_namespaced_config_map, name, namespace)
            except KubernetesError as error:
                if error.not_found and tries_left:
                    continue  # deleted in between: the name is free again
                raise
            return ConfigMapFound(body=json.loads(body), created=False)
        raise AssertionError("unreachable")  # pragma: no cover

    async def config_map_uid(self, *, namespace: str, name: str) -> str | None:
        """The uid of the ConfigMap ``name`` (its metadata only is read, not its up to 1 MiB
        of data), or None when there is none."""
        try:
            body = await self._call(
                self._core.read_namespaced_config_map,
                name,
                namespace,
                _headers={"Accept": METADATA_ONLY},
            )
        except KubernetesError as error:
            if error.not_found:
                return None
            raise
        uid = (json.loads(body).get("metadata") or {}).get("uid")
        return None if uid is None else str(uid)
