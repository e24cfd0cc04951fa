"""One tenant's large WorkflowDefinitions do not run a webhook replica out of memory (issue
24), tried on the real apiserver: the tenant's namespace holds ``LARGE`` definitions of
1 MiB each (a task's config; 10,000 tasks weigh as much and cost the apiserver far more to
store) beside a small one, and ``REVIEWS`` reviews of that
namespace read what admission reads (``admission/registry.py``: the workflow's persisted
objects, the spec of the version asked about) at once, through the webhook's own client.
Their peak of Python memory (tracemalloc) stays under ``PEAK_BOUND``.

Held when the namespace is listed in pages within a byte budget (``kube/pages.py``), each
page dropped once the workflow's objects are taken from it, and only the asked version's spec
kept. Before, each review parsed one unpaged LIST of every object (figures in
``docs/security.md``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import tracemalloc
from typing import Any

import pytest
from kubernetes import client as k8s

from flowforge.admission.registry import StoreDefinitionRegistry
from flowforge.domain.api import DEFINITION_PLURAL, GROUP, VERSION
from flowforge.kube.client import KubeClient
from flowforge.localdev.controlplane import Cluster
from flowforge.store.connection import Pool
from tests.support.admission import definition

pytestmark = pytest.mark.cluster

LARGE = 40
PAD_BYTES = 1 << 20
REVIEWS = 6
PEAK_BOUND = 64 << 20  # a replica's limit is 384 Mi


def large(version: int) -> dict[str, Any]:
    body = definition(name=f"big-v{version}", version=version, workflow="big")
    body["spec"]["tasks"][0]["config"] = {"pad": "x" * PAD_BYTES}
    return body


def create(api: k8s.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    response = k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, DEFINITION_PLURAL, body, _preload_content=False
    )
    response.drain_conn()
    response.release_conn()


async def test_reviews_of_a_namespace_of_large_definitions_hold_one_page_each(
    cluster: Cluster,
    flowforge_crds: list[str],
    namespace: str,
    kube_api: k8s.ApiClient,
    engine_store: Pool,
) -> None:
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        bodies = [definition(name="etl-v1"), *(large(v) for v in range(1, LARGE + 1))]
        list(pool.map(lambda body: create(kube_api, namespace, body), bodies))
    seconds = time.monotonic() - started
    kube = KubeClient.connect(kubeconfig=str(cluster.kubeconfig), threads=8)  # as the webhook
    registry = StoreDefinitionRegistry(engine_store, list_definitions=kube.list_definitions)
    tracemalloc.start()
    try:
        reviews = [
            registry.persisted(namespace=namespace, workflow="etl", version=1)
            for _ in range(REVIEWS // 2)
        ] + [
            registry.persisted(namespace=namespace, workflow="big", version=LARGE + 1)
            for _ in range(REVIEWS // 2)
        ]
        found = await asyncio.gather(*reviews)
        loaded = await registry.load_definition(namespace=namespace, workflow="etl", version=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        kube.close()
    print(
        f"\n{LARGE} definitions of {PAD_BYTES >> 20} MiB created in {seconds:.1f} s; "
        f"{REVIEWS} concurrent reviews' peak: {peak / 2**20:.0f} MiB"
    )
    etl, big = found[0], found[-1]
    assert [(other.name, other.version, other.spec is not None) for other in etl] == [
        ("etl-v1", 1, True)
    ]
    assert sorted(other.version for other in big) == list(range(1, LARGE + 1))
    assert all(other.spec is None for other in big)  # not the version asked about: not kept
    assert loaded is not None and [task.key for task in loaded.tasks] == ["extract", "load"]
    assert peak < PEAK_BOUND, f"peak {peak / 2**20:.0f} MiB"
