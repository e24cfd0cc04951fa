"""WorkflowRuns created and waited for; definitions published."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kubernetes import client as k8s

from flowforge.domain.api import API_VERSION, GROUP, RUN_KIND, RUN_PLURAL, VERSION
from flowforge.domain.validation import parse_definition
from flowforge.store.definitions import publish_definition
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool
from harness.watch import in_groups

STEP = {"image": "busybox:1.36"}
FINISHED_RUN = ("Succeeded", "Failed", "Cancelled")


def chain_definition(length: int, *, workflow: str = "chain") -> dict[str, Any]:
    """t0 -> t1 -> ... -> t(length-1)."""
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"step": STEP},
        "tasks": [{"key": "t0", "type": "step"}]
        + [{"key": f"t{n}", "type": "step", "dependsOn": [f"t{n - 1}"]} for n in range(1, length)],
    }


async def publish(dsn: str, namespace: str, specs: Iterable[dict[str, Any]]) -> None:
    """Publish definitions straight into the store (no webhook, no definition object)."""
    await migrate(dsn)
    pool = await open_pool(dsn, min_size=1, max_size=2)
    for spec in specs:
        await publish_definition(pool, namespace=namespace, definition=parse_definition(spec))
    await pool.close()


def create_run_object(
    custom: k8s.CustomObjectsApi,
    namespace: str,
    name: str,
    *,
    workflow: str,
    finalizers: Sequence[str] = (),
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Create a WorkflowRun of ``workflow`` version 1; returns the created object."""
    metadata: dict[str, Any] = {"name": name}
    if finalizers:
        metadata["finalizers"] = list(finalizers)
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        RUN_PLURAL,
        {
            "apiVersion": API_VERSION,
            "kind": RUN_KIND,
            "metadata": metadata,
            "spec": {"workflow": workflow, "version": 1, **(spec or {})},
        },
    )
    return created


def create_runs(
    custom: k8s.CustomObjectsApi,
    namespace: str,
    prefix: str,
    workflow: str,
    count: int,
    **spec: Any,
) -> list[str]:
    """``count`` runs named ``prefix-000``..., created concurrently; their names."""
    names = [f"{prefix}-{i:03d}" for i in range(count)]
    in_groups(
        lambda name: create_run_object(custom, namespace, name, workflow=workflow, spec=spec),
        names,
    )
    return names


def wait_phases(
    list_phases: Callable[[], dict[str, str]],
    names: list[str],
    timeout: float,
    *,
    poll: float = 0.25,
    final: Sequence[str] = FINISHED_RUN,
) -> dict[str, str]:
    """Poll the runs' phases until every one of ``names`` is final (a LIST of every run is
    heavy for the apiserver: the interval bounds the throughput figure's error, 0.25 s in
    60 s)."""
    deadline = time.monotonic() + timeout
    wanted = set(names)
    phases: dict[str, str] = {}
    while time.monotonic() < deadline:
        phases = {name: phase for name, phase in list_phases().items() if name in wanted}
        if len(phases) == len(wanted) and all(p in final for p in phases.values()):
            return phases
        time.sleep(poll)
    raise SystemExit(f"runs not finished in {timeout} s: {phases}")


def list_phases(
    custom: k8s.CustomObjectsApi, namespace: str, *, group: str, version: str, plural: str
) -> dict[str, str]:
    items = custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]
    return {item["metadata"]["name"]: (item.get("status") or {}).get("phase", "") for item in items}


def wait_finished(
    custom: k8s.CustomObjectsApi,
    namespace: str,
    names: list[str],
    timeout: float,
    *,
    poll: float = 0.25,
) -> dict[str, str]:
    return wait_phases(
        lambda: list_phases(custom, namespace, group=GROUP, version=VERSION, plural=RUN_PLURAL),
        names,
        timeout,
        poll=poll,
    )
