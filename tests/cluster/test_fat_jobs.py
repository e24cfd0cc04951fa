"""One tenant's fat Jobs do not run the operator out of memory (issue 24), tried on the real
control plane as a tenant would: in its own namespace it creates suspended Jobs labelled
``app.kubernetes.io/managed-by=flowforge``, each carrying 1 MiB in an env value. The operator
(a subprocess, as deployed) starts after them, so its watches' first listings and the
reconciler's first pass both meet every one; its peak RSS (``VmHWM``) is read once that pass
is over.

Held when the reconciler reads each LIST page only up to a byte budget (``kube/pages.py``: a
page over it is asked for again with a smaller ``limit``) and keeps of each Job a small record
(``kube/job_record.py``), and kopf lists in pages of ``WATCH_LIST_CHUNK`` objects. Before,
kopf's first LIST and the reconciler's were one page each, and the reconciler kept every Job
for its pass: 50 of these Jobs took the peak to 360 MiB, 100 to 663 MiB and 400 (the attack
as reported, a minute to create here) to 2,173 MiB; now 60 take it to about 170 MiB and 400
to 181 MiB (it idles at 106 MiB). ``FAT_JOBS`` keep the module within a minute.
"""

from __future__ import annotations

import concurrent.futures
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from flowforge.kube.jobs import LABEL_MANAGED_BY, MANAGED_BY
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

FAT_JOBS = 60
PAD_BYTES = 1 << 20
PEAK_BOUND = 256 << 20  # the chart's limit is 512 Mi


def fat_job(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"fat-{index:04d}", "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "task",
                            "image": "example.invalid/task:1",
                            "env": [{"name": "PAD", "value": "x" * PAD_BYTES}],
                        }
                    ],
                }
            },
        },
    }


def create_fat_jobs(api: k8s.ApiClient, namespace: str) -> float:
    """Create the tenant's Jobs (8 at a time); the seconds it took."""
    batch = k8s.BatchV1Api(api)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for created in pool.map(
            lambda index: batch.create_namespaced_job(
                namespace, fat_job(index), _preload_content=False
            ),
            range(FAT_JOBS),
        ):
            created.drain_conn()
            created.release_conn()
    return time.monotonic() - started


def peak_rss(pid: int) -> int:
    """The process's peak resident set (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def last_pass(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("flowforge_reconcile_last_pass_timestamp_seconds "):
                return float(line.split()[1])
    return 0.0


async def test_a_tenants_fat_jobs_leave_the_operator_under_its_memory_limit(
    operators: Callable[..., OperatorProcess],
    driver: RunDriver,
    namespace: str,
    kube_api: k8s.ApiClient,
) -> None:
    tenant = namespace
    seconds = create_fat_jobs(kube_api, tenant)
    metrics_port = free_port()
    operator = operators(
        env={
            "FLOWFORGE_NAMESPACES": f"{driver.namespace},{tenant}",
            "FLOWFORGE_METRICS_PORT": str(metrics_port),
        }
    )
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    await wait_until(
        lambda: last_pass(metrics_port) > 0,
        timeout=60,
        what="a reconciler pass over the tenant's Jobs",
        operator=operator,
    )
    assert operator.process is not None and operator.running, operator.log_tail()
    peak = peak_rss(operator.process.pid)
    print(
        f"\n{FAT_JOBS} Jobs of {PAD_BYTES >> 20} MiB created in {seconds:.1f} s; "
        f"the operator's peak RSS over its first pass: {peak / 2**20:.0f} MiB"
    )
    assert peak < PEAK_BOUND, f"peak RSS {peak / 2**20:.0f} MiB"
